"""label_party/metrics.jsonl: append-only JSON lines, one record per line, flushed as written;
read whole, or followed as it grows."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from splitleak.fileio import naming


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/Inf; readers see null
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class MetricsWriter:
    """Appends records; `keep` (a resumed run) first cuts the file back to its first `keep`
    complete records, so the run continues exactly where its checkpoint was taken."""

    def __init__(self, path: Path, keep: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.records = 0
        if keep is not None:
            self.records = truncate_records(path, keep)
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        with naming(self.path):  # a full disk names this file, as every other write does
            self._file.write(json.dumps(_clean(record), separators=(",", ":")) + "\n")
            self._file.flush()
        self.records += 1

    def sync(self) -> None:
        """Make every record written so far survive a machine crash (before a checkpoint)."""
        with naming(self.path):
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def truncate_records(path: Path, keep: int) -> int:
    """Cut a metrics file to its first `keep` complete lines; returns how many it now has."""
    if not path.exists():
        return 0
    kept = end = 0
    with path.open("rb") as f:
        for line in f:
            if kept == keep or not line.endswith(b"\n"):
                break
            kept += 1
            end += len(line)
    os.truncate(path, end)
    return kept


class MetricsError(ValueError):
    """A metrics file that cannot be read; the message names the file, the line and the field."""


# Fields of the plan, train and eval records that hold a number (or null: NaN, or not scored).
NUMBER_FIELDS = frozenset({
    "epoch", "step", "loss", "wall", "batch_size", "positives", "epochs", "steps_per_epoch",
    "total_train_steps", "eval_interval", "passive_parties", "num_classes", "train_rows",
    "test_rows", "seed"})
SPLIT_NUMBERS = ("_loss", "_rows", "_auc", "_accuracy")  # test_* / train_* figures of an eval


def _is_number_field(key: str) -> bool:
    return key in NUMBER_FIELDS or (key.startswith(("test_", "train_")) and key.endswith(SPLIT_NUMBERS))


def check_record(record: Any, where: str) -> dict[str, Any]:
    """`record` if it is a metrics record (an object with a string "type" whose figures are
    numbers or null); MetricsError naming `where` and the field otherwise."""
    if not isinstance(record, dict):
        raise MetricsError(f"{where}: a record is a JSON object, not {type(record).__name__}")
    if not isinstance(record.get("type"), str):
        raise MetricsError(f"{where}: \"type\" must be a string such as \"train\" or \"eval\", "
                           f"got {record.get('type')!r}")
    for key, value in record.items():
        if _is_number_field(key) and (isinstance(value, bool) or not isinstance(value, int | float | None)):
            raise MetricsError(f"{where}: field {key!r} must be a number or null, got {value!r}")
    return record


def _parse_line(line: bytes, where: str) -> dict[str, Any]:
    try:
        return check_record(json.loads(line.decode("utf-8")), where)
    except UnicodeDecodeError as err:
        raise MetricsError(f"{where}: not UTF-8 text (byte {err.object[err.start]:#04x} at "
                           f"offset {err.start}); metrics are JSON lines") from None
    except json.JSONDecodeError as err:
        raise MetricsError(f"{where}: not a JSON record ({err.msg} at column {err.colno})") from None


def _check_torn(line: bytes, where: str) -> None:
    """A last line without its newline is a record cut by a crash mid-write: the start of a
    JSON object. MetricsError for anything else (the file is not metrics)."""
    tail = line.strip()
    if tail and not tail.startswith(b"{"):
        raise MetricsError(f"{where}: neither a JSON record nor the torn start of one (a record "
                           "is a JSON object on one line)")


def read_metrics(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete record; a torn last line (crash mid-write) is skipped. MetricsError naming
    the file and line for a file that cannot be read or a line that is not a record."""
    try:
        with path.open("rb") as f:
            for number, line in enumerate(f, start=1):
                if line.endswith(b"\n"):
                    yield _parse_line(line, f"{path} line {number}")
                else:
                    _check_torn(line, f"{path} line {number}")
    except OSError as err:
        raise MetricsError(f"cannot read {path}: {err.strerror or err}") from None


class MetricsTail:
    """Reads the complete lines appended to a JSON-lines file since the last call (a file cut
    back, as a resumed run's is, is read again from its start)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                if os.fstat(f.fileno()).st_size < self._offset:
                    self._offset, self._partial = 0, b""
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [json.loads(line) for line in lines if line.strip()]
