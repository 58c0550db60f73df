"""Reading distributed delimited text files column by column; errors name the file and line."""

from __future__ import annotations

import csv as pycsv
import gzip
import io
import tarfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import csv

from splitleak.datasets.base import DatasetError
from splitleak.filekind import not_a_file

BLOCK_BYTES = 1 << 22  # text parsed per batch: bounds memory when streaming; larger is slower
# How compressed files start: gzip is read decompressed, the others are refused.
MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd",
         b"PK\x03\x04": "zip"}


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
    if not file.is_file():
        # Each host of a deployment reads the same path: a relative one from the directory the
        # process was started in, which differs from host to host.
        where = "" if file.is_absolute() else f" (relative to the working directory {Path.cwd()})"
        raise DatasetError(f"{kind}: {path}{where} {not_a_file(file)}; give the path of the "
                           "data file itself")
    try:
        file.open("rb").close()  # every later read opens it again: refuse it once, here
    except OSError as err:
        raise DatasetError(f"{kind}: {path} cannot be read ({err.strerror or err}): give this "
                           "process read access to it (e.g. chmod a+r)") from None
    if is_archive(file):
        raise DatasetError(f"{kind}: {path} is a tar archive (as downloaded?): unpack it (e.g. "
                           "tar xf) and give the path of the data file in it")
    return file


def is_archive(file: Path) -> bool:
    """Whether the file is a tar archive, plain or gzip-compressed: its first 512 bytes are a
    tar header, checksum and all (tarfile.is_tarfile takes 512 zero bytes, e.g. a black CIFAR
    image's first row, for an empty archive)."""
    opener = gzip.open if packed(file) == "gzip" else open
    try:
        with opener(file, "rb") as raw:
            tarfile.TarInfo.frombuf(raw.read(tarfile.BLOCKSIZE), "utf-8", "surrogateescape")
    except (tarfile.HeaderError, OSError, EOFError, zlib.error):  # a damaged stream is named later
        return False
    return True


def packed(file: Path) -> str | None:
    """How the file is compressed ("gzip", "zip", ...: told by its first bytes), or None."""
    with file.open("rb") as raw:
        start = raw.read(6)
    return next((name for magic, name in MAGIC.items() if start.startswith(magic)), None)


def compression(file: Path) -> str | None:
    """"gzip" for a gzip-compressed file (told by its first bytes, not its name), else None."""
    kind = packed(file)
    if kind not in (None, "gzip"):
        raise DatasetError(f"{file} is {kind}-compressed: decompress it first (plain or "
                           "gzip-compressed text is read)")
    return kind


@contextmanager
def intact(file: Path) -> Iterator[None]:
    """Reads within of a damaged (cut or corrupted) gzip file raise a DatasetError naming it, not
    pyarrow's OSError or gzip's EOFError / BadGzipFile / zlib.error."""
    try:
        yield
    except (OSError, EOFError, zlib.error) as error:
        if compression(file) != "gzip":
            raise
        raise DatasetError(f"{file}: its gzip stream is damaged ({error}): the file is cut short "
                           "or corrupted; copy or compress it again") from None


@contextmanager
def open_text(file: Path) -> Iterator[TextIO]:
    """The file's text as pyarrow reads it: gzip decompressed, a UTF-8 byte-order mark dropped,
    bytes that are not UTF-8 kept as surrogates (so that errors can name them)."""
    opener = gzip.open if compression(file) else open
    with intact(file), opener(file, "rt", encoding="utf-8-sig", errors="surrogateescape",
                              newline="") as text:
        yield text


def bounded_lines(text: TextIO) -> Iterator[tuple[int, str, int]]:
    """(line number, its first BLOCK_BYTES characters at most, its size in bytes) of each line:
    memory stays bounded by a block however long a line is (a binary file may hold none)."""
    number = 0
    while piece := text.readline(BLOCK_BYTES + 1):  # a whole line, if it may be a row
        number += 1
        head, size = piece, _bytes(piece)
        while not piece.endswith(("\n", "\r")) and (piece := text.readline(BLOCK_BYTES)):
            size += _bytes(piece)
        yield number, head, size


def _bytes(text: str) -> int:
    return len(text.encode(errors="surrogateescape"))


def first_text_line(file: Path) -> tuple[int, str]:
    """(line number, text) of the file's first line that is not blank: leading blank lines are
    skipped here as the reader skips every blank line; (1, "") for a file of blank lines. A
    line longer than a row may be is cut there (the reader refuses it, naming its line)."""
    with open_text(file) as lines:
        for number, line, _ in bounded_lines(lines):
            text = line.rstrip("\r\n")
            if text:
                return number, text
    return 1, ""


def first_line(file: Path) -> str:
    """The first line that is not blank (first_text_line)."""
    return first_text_line(file)[1]


def header_line(file: Path) -> int:
    """The number of the line a header is read from (the first that is not blank)."""
    return first_text_line(file)[0]


def read_header(file: Path, kind: str, delimiter: str) -> tuple[str, ...]:
    """Column names on the first line that is not blank (surrounding quotes and spaces removed)."""
    _, first = first_text_line(file)
    if not first:
        raise DatasetError(f"{file}: expected the {kind} header, got no line that is not blank")
    return tuple(name.strip().strip('"') for name in first.split(delimiter))


def starts_with_header(file: Path, delimiter: str, first_name: str) -> bool:
    """Whether the first line that is not blank names the columns (public copies of some sets
    add a header row the original lacks), told by its first field being `first_name` in any
    case (`Age`, `LABEL`: the header's check then says what it must name)."""
    return first_line(file).split(delimiter)[0].strip().strip('"').lower() == first_name.lower()


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

        with intact(self.file):
            yield from self._batches(include, max_rows)

    def _batches(
        self, include: Sequence[str], max_rows: int | None
    ) -> Iterator[tuple[int, dict[str, pa.Array]]]:
        first_row = 0
        source = pa.input_stream(str(self.file), compression=compression(self.file))
        if max_rows is not None:
            source = FirstLines(source, self._skipped_lines + max_rows)
        # pyarrow refuses a row only when it straddles two block boundaries, so a row of 4 to
        # 8 MiB would pass or not depending on where it sits: every longer row is refused.
        source = RowLimit(source, BLOCK_BYTES)
        try:
            reader = csv.open_csv(
                source,
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
        except RowTooLong:
            raise self._long_row() or DatasetError(
                f"{self.file}: a row is longer than {BLOCK_BYTES:,} bytes, the most a row may "
                f"be ({self.fmt.kind})") from None
        except pa.ArrowInvalid as error:
            if "Empty CSV file" not in str(error):
                raise self._locate_parse_error(error, include, max_rows) from None
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
        """Lines before the first row: leading blank lines and a header, or a preamble line
        (never both: each is the file's first line that is not blank). pyarrow counts blank
        lines among the rows it skips."""
        number, first = first_text_line(self.file)
        preamble = self.fmt.preamble is not None and first.startswith(self.fmt.preamble)
        return number if self.fmt.header or preamble else 0

    def _rows(self, max_rows: int | None = None) -> Iterator[tuple[int, list[str]]]:
        """(line number, fields) of each data row as pyarrow sees it (blank lines skipped, a row
        never longer than a line); used on error paths only."""
        pycsv.field_size_limit(max(pycsv.field_size_limit(), 1 << 30))  # Python's: 128 KiB
        rows = 0
        with open_text(self.file) as lines:
            for number, line in enumerate(lines, 1):
                if number <= self._skipped_lines or not line.strip("\r\n"):
                    continue
                if max_rows is not None and rows == max_rows:
                    return
                reader = pycsv.reader((line,), delimiter=self.fmt.delimiter,
                                      quoting=pycsv.QUOTE_MINIMAL)
                yield number, [field.rstrip("\r\n") for field in next(reader)]
                rows += 1

    def _where(self, row: int) -> str:
        for index, (line, _) in enumerate(self._rows()):
            if index == row:
                return f"line {line}"
        return f"data row {row + 1}"  # our line scan and pyarrow disagree; still say which row

    def _long_row(self) -> DatasetError | None:
        """The first row longer than a block, named by its line and size (None: there is none)."""
        with open_text(self.file) as lines:
            for number, _, size in bounded_lines(lines):
                if size > BLOCK_BYTES:
                    return DatasetError(f"{self.file}, line {number}: the row is {size:,} "
                                        f"bytes long; a row may be at most {BLOCK_BYTES:,} "
                                        f"bytes ({self.fmt.kind})")
        return None

    def _locate_parse_error(self, error: pa.ArrowInvalid, include: Sequence[str],
                            max_rows: int | None) -> DatasetError:
        if "straddling object" in str(error):  # a row over a block or two
            long_row = self._long_row()
            if long_row is not None:
                return long_row
        expected = len(self.fmt.names)
        for line, fields in self._rows(max_rows):
            if len(fields) != expected:
                text = self.fmt.delimiter.join(fields)
                return DatasetError(
                    f"{self.file}, line {line}: expected {expected} fields separated by "
                    f"{self.fmt.delimiter!r} ({self.fmt.kind}), got {len(fields)}: {text[:120]!r}"
                )
            for name, value in zip(self.fmt.names, fields, strict=True):
                if name in include and not _is_utf8(value):
                    raw = value.encode(errors="surrogateescape")
                    return DatasetError(f"{self.file}, line {line}: column {name!r} is "
                                        f"{raw[:120]!r}, expected UTF-8 text ({self.fmt.kind})")
        return DatasetError(f"{self.file}: cannot read as {self.fmt.kind}: {error}")


class RowTooLong(Exception):
    """A line of the text stream is longer than RowLimit's limit."""


class RowLimit(io.RawIOBase):
    """The stream as it is, but RowTooLong once a line (its line end included) is longer than
    `limit` bytes, wherever it sits; a few C-speed searches per chunk read."""

    def __init__(self, source: pa.NativeFile | io.RawIOBase, limit: int) -> None:
        super().__init__()
        self.source, self.limit, self.open_bytes = source, limit, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        chunk = self.source.read(size if size > 0 else self.limit)
        if not chunk:
            return chunk
        end = _first_end(chunk)
        if end < 0:
            self.open_bytes += len(chunk)
            if self.open_bytes > self.limit:
                raise RowTooLong
            return chunk
        if self.open_bytes + end + 1 > self.limit:
            raise RowTooLong
        # Lines that start and end in the chunk: from each line end, the next must come within
        # `limit` bytes (the last one found there is the next place to look from).
        while len(chunk) - (end + 1) > self.limit:
            end = _last_end(chunk, end + 1, end + 1 + self.limit)
            if end < 0:
                raise RowTooLong
        self.open_bytes = len(chunk) - _last_end(chunk, 0, len(chunk)) - 1
        if self.open_bytes > self.limit:
            raise RowTooLong
        return chunk


def _first_end(chunk: bytes) -> int:
    """Where the chunk's first line ends (the last byte of `\n`, `\r\n` or a lone `\r`, as
    pyarrow ends a line: a file with classic Mac line ends is rows too), or -1."""
    newline, cr = chunk.find(b"\n"), chunk.find(b"\r")
    if cr < 0 or 0 <= newline <= cr + 1:
        return newline
    return cr


def _last_end(chunk: bytes, start: int, stop: int) -> int:
    """Where the last line end in chunk[start:stop] is (as _first_end), or -1."""
    return max(chunk.rfind(b"\n", start, stop), chunk.rfind(b"\r", start, stop))


class FirstLines(io.RawIOBase):
    """A stream cut after its first `count` non-blank lines: rows beyond max_rows are never
    parsed (pyarrow parses a whole block at a time)."""

    def __init__(self, source: pa.NativeFile, count: int) -> None:
        super().__init__()
        self.source, self.left, self.open_line = source, count, False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        chunk = self.source.read(size if size > 0 else BLOCK_BYTES)
        end = 0
        for piece in chunk.split(b"\n")[:-1]:
            end += len(piece) + 1
            if self.open_line or piece.strip(b"\r"):
                self.left -= 1
                if self.left == 0:
                    return chunk[:end]
            self.open_line = False
        self.open_line = self.open_line or bool(chunk[end:].strip(b"\r"))
        return chunk


def _is_utf8(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:  # a byte that is not UTF-8, kept as a surrogate by open_text
        return False
    return True


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
