"""CIFAR-10 / CIFAR-100 read from the binary version's .bin files at a path the user gives."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from splitleak.datasets.base import (
    DATASETS,
    DataPath,
    Dataset,
    DatasetError,
    DatasetParams,
    FeatureSlice,
    Schema,
)
from splitleak.datasets.delimited import is_archive, packed
from splitleak.datasets.tabular import image_slice
from splitleak.filekind import not_a_file
from splitleak.settings import MAX_ROWS

SIDE, CHANNELS = 32, 3
PIXEL_BYTES = CHANNELS * SIDE * SIDE  # 1,024 red, then green, then blue, each row by row


class CifarParams(DatasetParams):
    path: DataPath  # a .bin file, or the folder the binary archive unpacks to
    max_rows: int | None = Field(None, ge=2, le=MAX_ROWS)  # only the first rows, in file order


class Cifar100Params(CifarParams):
    label: Literal["fine", "coarse"] = "fine"  # 100 classes, or the 20 superclasses


@DATASETS.register("cifar10")
class Cifar10(Dataset):
    """Columns are the 32 pixel columns; a range is a vertical strip (Fu et al.'s halves:
    passive = [[0, 16], [16, 32]]). A folder is read as every batch file of the archive that is
    there, train batches first; the split is then the config's test_fraction, like every dataset."""

    Params: ClassVar[type[CifarParams]] = CifarParams
    params: CifarParams
    KIND = "CIFAR-10 binary version"
    FILES = (*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin")
    FOLDER_FILES = FILES
    LABELS: ClassVar[tuple[tuple[str, int], ...]] = (("label", 10),)  # (name, classes) per byte

    def _files(self) -> tuple[Path, ...]:
        path = Path(self.params.path).expanduser()
        if path.is_file():
            return (path,)
        if not path.is_dir():
            raise DatasetError(f"{self.KIND}: {self.params.path} {not_a_file(path)} (give a .bin "
                               f"file or the folder holding {', '.join(self.FILES)})")
        found = tuple(path / name for name in self.FILES if (path / name).is_file())
        if not found:
            raise DatasetError(f"{self.KIND}: {self.params.path} holds none of "
                               f"{', '.join(self.FILES)}")
        return found

    def _label(self) -> int:
        """Which label byte of a record is the label (LABELS says how many classes it has)."""
        return 0

    def _table(self) -> tuple[np.ndarray, np.ndarray]:
        return read_records(self._files(), self.LABELS, self._label(), self.params.max_rows,
                            self.KIND)

    def schema(self) -> Schema:
        return Schema(numeric_names=(), categorical_names=(), cardinalities=(),
                      num_classes=self.LABELS[self._label()][1], num_rows=self._table()[1].size,
                      image_shape=(CHANNELS, SIDE, SIDE))

    def features(self, columns: tuple[int, int]) -> FeatureSlice:
        strip = image_slice(self.schema(), columns, self._table()[0])  # only the strip as float
        np.divide(strip.numeric, 255.0, out=strip.numeric)
        return strip

    def labels(self) -> np.ndarray:
        return self._table()[1].copy()


@DATASETS.register("cifar100")
class Cifar100(Cifar10):
    """CIFAR-100's train.bin / test.bin; each record carries the coarse then the fine label."""

    Params = Cifar100Params
    params: Cifar100Params
    KIND = "CIFAR-100 binary version"
    FILES = ("train.bin", "test.bin")
    FOLDER_FILES = FILES
    LABELS = (("coarse label", 20), ("fine label", 100))

    def _label(self) -> int:
        return 1 if self.params.label == "fine" else 0


@functools.cache
def read_records(files: tuple[Path, ...], label_classes: tuple[tuple[str, int], ...],
                 label_index: int, max_rows: int | None,
                 kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(pixels uint8 [n, 3, 32, 32], labels int64 [n]) of the files in order, read once per
    process; every file must be whole records and every label byte (the one used or not) a
    class: a record with one out of range is corrupt."""
    label_bytes = len(label_classes)
    record = label_bytes + PIXEL_BYTES
    pixels, labels = [], []
    wanted = max_rows
    for file in files:
        size = file.stat().st_size
        try:  # a record's first byte is a label, < 20: never a compressed file's first byte
            archive = packed(file)
        except OSError as err:
            raise DatasetError(f"{file}: cannot read {kind} records: {err}") from None
        if archive is not None:
            raise DatasetError(f"{file} is {archive}-compressed (the {kind} archive as "
                               "downloaded?): unpack it (e.g. tar xzf) and give the folder it "
                               "makes or one of its .bin files")
        if is_archive(file):
            raise DatasetError(f"{file} is a tar archive (the {kind} archive as downloaded?): "
                               "unpack it (e.g. tar xf) and give the folder it makes or one of "
                               "its .bin files")
        if size == 0 or size % record:
            raise DatasetError(f"{file}: {size:,} bytes is not a whole number of {record:,}-byte "
                               f"{kind} records ({label_bytes} label byte(s) + {PIXEL_BYTES:,} "
                               f"pixel bytes); is it the binary version (.bin)?")
        count = size // record if wanted is None else min(size // record, wanted)
        try:
            rows = np.fromfile(file, dtype=np.uint8, count=count * record).reshape(count, record)
        except (OSError, ValueError) as err:  # unreadable, or shorter than it was a moment ago
            raise DatasetError(f"{file}: cannot read {kind} records: {err}") from None
        for index, (name, classes) in enumerate(label_classes):
            bad = np.flatnonzero(rows[:, index] >= classes)
            if bad.size:
                raise DatasetError(f"{file}: record {int(bad[0]) + 1} has {name} "
                                   f"{int(rows[bad[0], index])}; {kind} {name}s are "
                                   f"0..{classes - 1}")
        label = rows[:, label_index].astype(np.int64)
        pixels.append(rows[:, label_bytes:].reshape(count, CHANNELS, SIDE, SIDE))
        labels.append(label)
        if wanted is not None:
            wanted -= count
            if wanted == 0:
                break
    return np.concatenate(pixels), np.concatenate(labels)
