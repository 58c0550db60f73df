"""Reading distributed delimited text files column by column; errors name the file and line."""

from __future__ import annotations

import csv as pycsv
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv

from splitleak.datasets.base import DatasetError

BLOCK_BYTES = 1 << 22  # text parsed per batch: bounds memory when streaming; larger is slower


@dataclass(frozen=True)
class TextFormat:
    """How a file is laid out as distributed."""

    kind: str  # names the format in error messages, e.g. "Criteo train.txt"
    names: tuple[str, ...]  # every column in file order
    delimiter: str = ","
    header: bool = False  # the first line names the columns
    strip: bool = False  # values may carry spaces around them (adult's ", ")
    preamble: str | None = None  # a first line starting with this is not a row (adult.test's "|1x3")


def require_file(path: str, kind: str) -> Path:
    file = Path(path).expanduser()
    if file.is_dir():
        raise DatasetError(f"{kind}: {path} is a directory; give the path of the file itself")
    if not file.is_file():
        raise DatasetError(f"{kind} file not found: {path}")
    return file


def first_line(file: Path) -> str:
    with file.open(encoding="utf-8", errors="replace", newline="") as lines:
        return lines.readline().rstrip("\r\n")


def read_header(file: Path, kind: str, delimiter: str) -> tuple[str, ...]:
    """Column names on the first line (surrounding quotes and spaces removed)."""
    first = first_line(file)
    if not first:
        raise DatasetError(f"{file}, line 1: expected the {kind} header, got an empty line")
    return tuple(name.strip().strip('"') for name in first.split(delimiter))


def starts_with_header(file: Path, delimiter: str, first_name: str) -> bool:
    """Whether the first line names the columns (public copies of some sets add a header row
    the original lacks), told by its first field being `first_name`."""
    return first_line(file).split(delimiter)[0].strip().strip('"') == first_name


class DelimitedFile:
    """One text file of a known format, read only for the columns asked for."""

    def __init__(self, file: Path, fmt: TextFormat) -> None:
        self.file = file
        self.fmt = fmt

    def batches(
        self, include: Sequence[str], max_rows: int | None = None
    ) -> Iterator[tuple[int, dict[str, pa.Array]]]:
        """Yield (index of the batch's first row, string column per included name)."""
        if not include:
            raise ValueError("include at least one column")  # pyarrow would read them all

        first_row = 0
        try:
            reader = csv.open_csv(
                self.file,
                read_options=csv.ReadOptions(
                    column_names=list(self.fmt.names),
                    skip_rows=self._skipped_lines,
                    block_size=BLOCK_BYTES,
                    use_threads=False,
                ),
                # Quoted fields ("a;b", "x""y") as any CSV writer makes them. No Python
                # invalid-row handler: pyarrow's reader outlives an error on its I/O threads,
                # and releasing a Python callable there needs the GIL while the process exits.
                parse_options=csv.ParseOptions(delimiter=self.fmt.delimiter, quote_char='"'),
                convert_options=csv.ConvertOptions(
                    column_types={name: pa.string() for name in include},
                    include_columns=list(include),
                ),
            )
            try:
                for batch in reader:
                    if max_rows is not None:
                        batch = batch.slice(0, max_rows - first_row)
                    columns = {name: batch.column(name) for name in include}
                    if self.fmt.strip:
                        columns = {name: pc.utf8_trim_whitespace(c) for name, c in columns.items()}
                    yield first_row, columns
                    first_row += batch.num_rows
                    if max_rows is not None and first_row >= max_rows:
                        return
            finally:
                reader.close()
        except pa.ArrowInvalid as error:
            if "Empty CSV file" not in str(error):
                raise self._locate_parse_error(error) from None
        if first_row == 0:
            raise DatasetError(f"{self.file}: no data rows (expected {self.fmt.kind})")

    def read(self, include: Sequence[str], max_rows: int | None = None) -> dict[str, pa.Array]:
        """Every row of the included columns as one string array each."""
        parts: dict[str, list[pa.Array]] = {name: [] for name in include}
        for _, columns in self.batches(include, max_rows):
            for name, values in columns.items():
                parts[name].append(values)
        return {name: pa.concat_arrays(chunks) for name, chunks in parts.items()}

    def count_rows(self, column: str, max_rows: int | None = None) -> int:
        """Number of data rows, parsing only `column` (pick a cheap, label-free one)."""
        return sum(len(columns[column]) for _, columns in self.batches([column], max_rows))

    def numbers(
        self,
        column: str,
        values: pa.Array,
        first_row: int,
        *,
        integer: bool = False,
        allow_missing: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """float64 values and a missing mask ("" is missing only if allowed)."""
        missing = np.zeros(len(values), dtype=bool)
        if allow_missing:
            empty = pc.equal(values, "")
            missing = empty.to_numpy(zero_copy_only=False)
            values = pc.if_else(empty, "0", values)
        expected = "an integer" if integer else "a number"
        try:
            parsed = pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:
            row = _first_unparsable(values, pa.float64())
            raise self.bad_value(first_row + row, column, values[row].as_py(), expected) from None
        not_finite = ~np.isfinite(parsed)
        if not_finite.any():
            row = int(np.argmax(not_finite))
            raise self.bad_value(first_row + row, column, values[row].as_py(), "a finite number")
        # Integer columns may be written as floats ("260.0", as DeepCTR's Criteo sample ships).
        fractional = integer & (parsed != np.floor(parsed)) if integer else None
        if fractional is not None and fractional.any():
            row = int(np.argmax(fractional))
            raise self.bad_value(first_row + row, column, values[row].as_py(), expected)
        return parsed, missing

    def codes(
        self, column: str, values: pa.Array, first_row: int, mapping: Mapping[str, int]
    ) -> np.ndarray:
        """int64 code of each value by an exact lookup (e.g. label strings)."""
        keys = pa.array(list(mapping), type=values.type)
        index = pc.index_in(values, value_set=keys)
        if index.null_count:
            row = int(np.argmax(index.is_null().to_numpy(zero_copy_only=False)))
            allowed = ", ".join(repr(key) for key in mapping)
            raise self.bad_value(first_row + row, column, values[row].as_py(), f"one of {allowed}")
        return np.array(list(mapping.values()), dtype=np.int64)[index.to_numpy()]

    def bad_value(self, row: int, column: str, value: object, expected: str) -> DatasetError:
        return DatasetError(
            f"{self.file}, {self._where(row)}: column {column!r} is {value!r}, "
            f"expected {expected} ({self.fmt.kind})"
        )

    @cached_property
    def _skipped_lines(self) -> int:
        """Lines before the first row: a header, or a preamble line (never both: each is the
        file's first line)."""
        preamble = self.fmt.preamble is not None and first_line(self.file).startswith(self.fmt.preamble)
        return int(self.fmt.header or preamble)

    def _rows(self) -> Iterator[tuple[int, list[str]]]:
        """(line number, fields) of each data row as pyarrow sees it; used on error paths only."""
        with self.file.open(encoding="utf-8", errors="replace", newline="") as lines:
            reader = pycsv.reader(lines, delimiter=self.fmt.delimiter, quoting=pycsv.QUOTE_MINIMAL)
            for fields in reader:
                if not fields or reader.line_num <= self._skipped_lines:
                    continue
                yield reader.line_num, fields

    def _where(self, row: int) -> str:
        for index, (line, _) in enumerate(self._rows()):
            if index == row:
                return f"line {line}"
        return f"data row {row + 1}"  # our line scan and pyarrow disagree; still say which row

    def _locate_parse_error(self, error: pa.ArrowInvalid) -> DatasetError:
        expected = len(self.fmt.names)
        for line, fields in self._rows():
            if len(fields) != expected:
                text = self.fmt.delimiter.join(fields)
                return DatasetError(
                    f"{self.file}, line {line}: expected {expected} fields separated by "
                    f"{self.fmt.delimiter!r} ({self.fmt.kind}), got {len(fields)}: {text[:120]!r}"
                )
        return DatasetError(f"{self.file}: cannot read as {self.fmt.kind}: {error}")


def _first_unparsable(values: pa.Array, target: pa.DataType) -> int:
    """Index of the first value that does not cast, by bisection (vectorised casts only)."""
    low, high = 0, len(values)  # a bad value lies in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        try:
            pc.cast(values.slice(low, middle - low), target)
            low = middle
        except pa.ArrowInvalid:
            high = middle
    return low
