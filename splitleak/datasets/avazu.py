"""Avazu CTR (Kaggle train CSV with header, `id` column optional): every column but id and click
as a hashed category."""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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
    header_line,
    read_header,
    require_file,
)
from splitleak.datasets.encoding import hash_buckets
from splitleak.datasets.tabular import check_columns, field_ranges, make_slice, stack_columns
from splitleak.settings import MAX_ROWS

KIND = "Avazu CSV with header [id,]click,hour,..."
TIME_FIELDS = ("hour_of_day", "weekday")  # from `hour` (YYMMDDHH); weekday 0 = Monday
LABELS = {"0": 0, "1": 1}


class AvazuParams(DatasetParams):
    path: DataPath
    max_rows: int | None = Field(None, ge=1, le=MAX_ROWS)
    vocab_size: int = Field(100_000, ge=2, le=2**31 - 1)


def hour_fields(hour: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hour of day and weekday of YYMMDDHH integers (years 20YY)."""
    day, hour_of_day = np.divmod(hour, 100)
    year_month, day_of_month = np.divmod(day, 100)
    year, month = np.divmod(year_month, 100)
    months = ((2000 + year - 1970) * 12 + month - 1).astype("datetime64[M]")
    days = months.astype("datetime64[D]") + (day_of_month - 1).astype("timedelta64[D]")
    return hour_of_day, (days.astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday


def days_in_month(hour: np.ndarray) -> np.ndarray:
    """Days in the month of YYMMDDHH integers (years 20YY; 0 for a month out of 01-12)."""
    year, month = np.divmod(hour // 10_000, 100)
    first = ((2000 + year - 1970) * 12 + month - 1).astype("datetime64[M]")
    days = ((first + 1).astype("datetime64[D]") - first.astype("datetime64[D]")).astype(np.int64)
    return np.where((month >= 1) & (month <= 12), days, 0)


@DATASETS.register("avazu")
class Avazu(Dataset):
    """Categories -> stable hash buckets (empty -> 0); `hour` -> hour_of_day and weekday."""

    Params = AvazuParams
    params: AvazuParams

    def __init__(self, params: DatasetParams) -> None:
        super().__init__(params)
        self._file = self._open()

    def _open(self) -> DelimitedFile:
        file = require_file(self.params.path, "Avazu CSV")
        header = read_header(file, KIND, ",")
        absent = [name for name in ("click", "hour") if name not in header]
        if len(header) == 1:  # a tab- or ';'-separated copy: its names are one field
            raise DatasetError(
                f"{file}, line {header_line(file)}: expected a header of column names separated "
                f"by ',' ({KIND}), got one field: {header[0][:200]!r}")
        if absent or len(set(header)) != len(header):
            raise DatasetError(
                f"{file}, line {header_line(file)}: expected a header naming click, hour (and "
                f"id, if present) "
                f"and the other columns once each ({KIND}), got {','.join(header)[:200]!r}"
            )
        return DelimitedFile(file, TextFormat(kind=KIND, names=header, header=True))

    @cached_property
    def _layout(self) -> Schema:
        """The schema without the row count, which costs a pass over the file."""
        hashed = tuple(n for n in self._file.fmt.names if n not in ("id", "click", "hour"))
        return Schema(
            numeric_names=(),
            categorical_names=TIME_FIELDS + hashed,
            cardinalities=(24, 7) + (self.params.vocab_size,) * len(hashed),
            num_classes=2,
            num_rows=0,
        )

    @cached_property
    def _num_rows(self) -> int:
        return self._file.count_rows("hour", self.params.max_rows)

    def schema(self) -> Schema:
        return replace(self._layout, num_rows=self._num_rows)

    def layout(self) -> Schema:
        return self._layout

    def features(self, columns: tuple[int, int]) -> FeatureSlice:
        columns = check_columns(self._layout, columns)
        _, fields = field_ranges(self._layout, columns)
        names = [self._layout.categorical_names[i] for i in fields]
        read = sorted({"hour" if name in TIME_FIELDS else name for name in names})
        parts = [
            self._encode(first_row, batch, names)
            for first_row, batch in self._file.batches(read, self.params.max_rows)
        ]
        rows = sum(len(part) for part in parts)
        return make_slice(self._layout, columns, np.zeros((rows, 0)), np.concatenate(parts))

    def _encode(self, first_row: int, batch: dict[str, pa.Array], names: list[str]) -> np.ndarray:
        rows = len(next(iter(batch.values())))
        time = self._time_fields(first_row, batch["hour"]) if "hour" in batch else {}
        encoded = [
            time[name] if name in TIME_FIELDS else hash_buckets(batch[name], self.params.vocab_size)
            for name in names
        ]
        return stack_columns(encoded, rows, np.int64)

    def _time_fields(self, first_row: int, values: pa.Array) -> dict[str, np.ndarray]:
        expected = "YYMMDDHH (8 digits, a date of the calendar, hour 00-23)"
        parsed, _ = self._file.numbers("hour", values, first_row, integer=True)
        hour = parsed.astype(np.int64)
        month, day, hour_of_day = hour // 10_000 % 100, hour // 100 % 100, hour % 100
        bad = (
            (pc.utf8_length(values).to_numpy(zero_copy_only=False) != 8)
            | (month < 1) | (month > 12) | (day < 1) | (day > days_in_month(hour))
            | (hour_of_day > 23)
        )  # fmt: skip
        if bad.any():
            row = int(np.argmax(bad))
            raise self._file.bad_value(first_row + row, "hour", values[row].as_py(), expected)
        return dict(zip(TIME_FIELDS, hour_fields(hour), strict=True))

    def check_values(self) -> None:
        """Labels and hours; any category string hashes, once it is UTF-8 text."""
        for first_row, batch in self._file.batches(self._file.fmt.names, self.params.max_rows):
            self._file.codes("click", batch["click"], first_row, LABELS)
            self._time_fields(first_row, batch["hour"])

    def labels(self) -> np.ndarray:
        return np.concatenate(
            [
                self._file.codes("click", batch["click"], first_row, LABELS)
                for first_row, batch in self._file.batches(["click"], self.params.max_rows)
            ]
        )
