"""label_party/metrics.jsonl: append-only JSON lines, one record per line, flushed as written;
read whole, or followed as it grows."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
        self._file.write(json.dumps(_clean(record), separators=(",", ":")) + "\n")
        self._file.flush()
        self.records += 1

    def sync(self) -> None:
        """Make every record written so far survive a machine crash (before a checkpoint)."""
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


def read_metrics(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete record; a torn last line (crash mid-write) is skipped."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                yield json.loads(line)


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
