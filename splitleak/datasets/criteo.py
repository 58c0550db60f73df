"""Criteo Display Advertising (Kaggle train.txt, or a CSV copy with a header such as DeepCTR's
criteo_sample.txt): 13 integer counts, 26 hashed categories."""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

import numpy as np
import pyarrow as pa
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
from splitleak.datasets.delimited import (
    DelimitedFile,
    TextFormat,
    first_line,
    header_line,
    read_header,
    require_file,
    starts_with_header,
)
from splitleak.datasets.encoding import hash_buckets
from splitleak.datasets.tabular import check_columns, field_ranges, make_slice, stack_columns
from splitleak.settings import MAX_ROWS

NUMERIC = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL = tuple(f"C{i}" for i in range(1, 27))
FORMAT = TextFormat(
    kind="Criteo train.txt: label, 13 integers, 26 categories, tab- (or comma-) separated",
    names=("label", *NUMERIC, *CATEGORICAL),
    delimiter="\t",
)
LABELS = {"0": 0, "1": 1}


def signed_log1p(values: np.ndarray) -> np.ndarray:
    """log1p of the magnitude with the sign kept (a few Criteo counts are negative)."""
    return np.sign(values) * np.log1p(np.abs(values))


class CriteoParams(DatasetParams):
    path: DataPath
    max_rows: int | None = Field(None, ge=1, le=MAX_ROWS)
    vocab_size: int = Field(100_000, ge=2, le=2**31 - 1)


@DATASETS.register("criteo")
class Criteo(Dataset):
    """Missing counts -> 0, then signed log1p; categories -> stable hash buckets, missing -> 0."""

    Params = CriteoParams
    params: CriteoParams

    def __init__(self, params: DatasetParams) -> None:
        super().__init__(params)
        self._file = self._open()

    def _open(self) -> DelimitedFile:
        """Kaggle's tab-separated train.txt as distributed, or a comma-separated copy; either
        may start with a `label,I1,...,C26` header row (counts may be written as `260.0`)."""
        file = require_file(self.params.path, "Criteo train.txt")
        delimiter = "\t" if "\t" in first_line(file) else ","
        fmt = replace(FORMAT, delimiter=delimiter)
        if starts_with_header(file, delimiter, "label"):
            header = read_header(file, FORMAT.kind, delimiter)
            if header != FORMAT.names:
                raise DatasetError(f"{file}, line {header_line(file)}: a Criteo header must name "
                                   f"{','.join(FORMAT.names[:3])},...,C26 in order, got "
                                   f"{','.join(header)[:200]!r}")
            fmt = replace(fmt, header=True)
        return DelimitedFile(file, fmt)

    @cached_property
    def _layout(self) -> Schema:
        """The schema without the row count, which costs a pass over the file."""
        return Schema(
            numeric_names=NUMERIC,
            categorical_names=CATEGORICAL,
            cardinalities=(self.params.vocab_size,) * len(CATEGORICAL),
            num_classes=2,
            num_rows=0,
        )

    @cached_property
    def _num_rows(self) -> int:
        return self._file.count_rows("I1", self.params.max_rows)

    def schema(self) -> Schema:
        return replace(self._layout, num_rows=self._num_rows)

    def layout(self) -> Schema:
        return self._layout

    def features(self, columns: tuple[int, int]) -> FeatureSlice:
        columns = check_columns(self._layout, columns)
        numeric_fields, categorical_fields = field_ranges(self._layout, columns)
        names = [NUMERIC[i] for i in numeric_fields] + [CATEGORICAL[i] for i in categorical_fields]
        parts = [self._encode(*batch) for batch in self._file.batches(names, self.params.max_rows)]
        numeric = np.concatenate([numeric for numeric, _ in parts])
        return make_slice(self._layout, columns, numeric, np.concatenate([c for _, c in parts]))

    def _encode(self, first_row: int, batch: dict[str, pa.Array]) -> tuple[np.ndarray, np.ndarray]:
        rows = len(next(iter(batch.values())))
        counts = [
            self._file.numbers(name, values, first_row, integer=True, allow_missing=True)[0]
            for name, values in batch.items()
            if name in NUMERIC
        ]
        buckets = [
            hash_buckets(values, self.params.vocab_size)
            for name, values in batch.items()
            if name in CATEGORICAL
        ]
        return (
            signed_log1p(stack_columns(counts, rows, np.float64)),
            stack_columns(buckets, rows, np.int64),
        )

    def check_values(self) -> None:
        """Labels and counts; any category string hashes, once it is UTF-8 text."""
        for first_row, batch in self._file.batches(FORMAT.names, self.params.max_rows):
            self._file.codes("label", batch["label"], first_row, LABELS)
            self._encode(first_row, {name: batch[name] for name in NUMERIC})

    def labels(self) -> np.ndarray:
        return np.concatenate(
            [
                self._file.codes("label", batch["label"], first_row, LABELS)
                for first_row, batch in self._file.batches(["label"], self.params.max_rows)
            ]
        )
