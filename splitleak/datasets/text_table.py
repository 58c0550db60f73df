"""Small delimited files read whole: numeric fields, file-vocabulary categories, a label column."""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import numpy as np

from splitleak.datasets.base import (
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
    first_text_line,
    header_line,
    read_header,
    require_file,
    starts_with_header,
)
from splitleak.datasets.encoding import vocabulary_codes
from splitleak.datasets.tabular import check_columns, field_ranges, make_slice, stack_columns


class PathParams(DatasetParams):
    path: DataPath


class TextTable(Dataset):
    """Base of loaders for UCI-style files. A category is coded by its rank among the sorted
    distinct values of its column in the file (from 1); `MISSING` values get 0."""

    Params = PathParams
    params: PathParams
    FORMAT: ClassVar[TextFormat]
    NUMERIC: ClassVar[tuple[str, ...]]
    CATEGORICAL: ClassVar[tuple[str, ...]] = ()
    LABEL: ClassVar[str]
    LABELS: ClassVar[dict[str, int]]
    MISSING: ClassVar[frozenset[str]] = frozenset()
    HEADER_FIRST: ClassVar[str | None] = None  # a header row starting so is checked and skipped
    SPELLINGS: ClassVar[dict[str, str]] = {}  # other copies' names of columns in a header

    def __init__(self, params: DatasetParams) -> None:
        super().__init__(params)
        self._file = self._open()

    def _open(self) -> DelimitedFile:
        file = require_file(self.params.path, self.FORMAT.kind)
        fmt = self.FORMAT
        if self.HEADER_FIRST and starts_with_header(file, fmt.delimiter, self.HEADER_FIRST):
            header = read_header(file, fmt.kind, fmt.delimiter)
            if tuple(self._spelled(name) for name in header) != fmt.names:
                raise DatasetError(
                    f"{file}, line {header_line(file)}: a header must name "
                    f"{','.join(fmt.names)} in this order "
                    f"({fmt.kind}), got {fmt.delimiter.join(header)[:200]!r}"
                )
            fmt = replace(fmt, header=True)
        elif not fmt.header:
            self._refuse_header(file)
        return DelimitedFile(file, fmt)

    def _refuse_header(self, file: Path) -> None:
        """A format with no header line whose file starts with one (as many fields as a row,
        its numeric fields all words): DatasetError saying so, rather than a bad value in its
        first "row". A line of another field count is no header: the parse names its count."""
        number, first = first_text_line(file)
        fmt = self.FORMAT
        if not first or (fmt.preamble is not None and first.startswith(fmt.preamble)):
            return
        fields = [value.strip().strip('"') for value in first.split(fmt.delimiter)]
        if len(fields) != len(fmt.names):  # another delimiter or layout, e.g. 39;State-gov;...
            return
        numeric = [value for name, value in zip(fmt.names, fields, strict=False)
                   if name in self.NUMERIC]
        if numeric and not any(_is_number(value) for value in numeric):
            shown = first if len(first) <= 60 else first[:59] + "…"
            raise DatasetError(
                f"{file}, line {number}: the file has a header line ({shown!r}), but this format "
                f"has none ({fmt.kind}; every line is a row): delete the header line")

    def _spelled(self, name: str) -> str:
        """A header's column name as FORMAT spells it (case, and `.` or `_` for `-`, aside)."""
        name = name.lower().replace(".", "-").replace("_", "-")
        return self.SPELLINGS.get(name, name)

    @cached_property
    def _schema(self) -> Schema:
        if self.CATEGORICAL:
            table = self._file.read(self.CATEGORICAL)
            cardinalities = tuple(vocabulary_codes(v, self.MISSING)[1] for v in table.values())
            num_rows = len(table[self.CATEGORICAL[0]])
        else:
            cardinalities, num_rows = (), self._file.count_rows(self.NUMERIC[0])
        return Schema(
            numeric_names=self.NUMERIC,
            categorical_names=self.CATEGORICAL,
            cardinalities=cardinalities,
            num_classes=len(set(self.LABELS.values())),
            num_rows=num_rows,
        )

    def schema(self) -> Schema:
        return self._schema

    def features(self, columns: tuple[int, int]) -> FeatureSlice:
        schema = self.schema()
        columns = check_columns(schema, columns)
        numeric_fields, categorical_fields = field_ranges(schema, columns)
        numeric_names = [self.NUMERIC[i] for i in numeric_fields]
        categorical_names = [self.CATEGORICAL[i] for i in categorical_fields]
        table = self._file.read(numeric_names + categorical_names)
        numeric = [self._file.numbers(name, table[name], 0)[0] for name in numeric_names]
        categorical = [vocabulary_codes(table[n], self.MISSING)[0] for n in categorical_names]
        return make_slice(
            schema,
            columns,
            stack_columns(numeric, schema.num_rows, np.float64),
            stack_columns(categorical, schema.num_rows, np.int64),
        )

    def check_values(self) -> None:
        """Numbers and labels, a block at a time; any category string is a category."""
        for first_row, batch in self._file.batches([*self.NUMERIC, self.LABEL]):
            self._file.codes(self.LABEL, batch[self.LABEL], first_row, self.LABELS)
            for name in self.NUMERIC:
                self._file.numbers(name, batch[name], first_row)

    def labels(self) -> np.ndarray:
        return self._file.codes(
            self.LABEL, self._file.read([self.LABEL])[self.LABEL], 0, self.LABELS
        )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
