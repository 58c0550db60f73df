"""sweep.parquet: one row per point (overrides, status, run directory, seconds), rewritten
atomically after every change so an interrupted sweep always leaves a readable index."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from orchestration.sweep.points import Point
from splitleak.fileio import write_atomically

INDEX_FILE = "sweep.parquet"
RESULT_FILE = "sweep_point.json"  # a point's outcome, in its run directory

# pending: not started; running: started by an engine (left over if the driver was killed);
# done: trained and analysed; failed: the run or its analysis failed (message says why);
# interrupted: stopped by Ctrl-C. Only `done` (and `failed`, unless retried) is skipped on a re-run.
STATUSES = ("pending", "running", "done", "failed", "interrupted")

# overrides: every override of the base (JSON, path -> value, in the order applied); axes: the
# axis values that tell the point's setting apart (JSON, path as the sweep file wrote it ->
# value, the seed left out): what the comparison reads back as the setting's identity.
SCHEMA = pa.schema([
    ("point", pa.int32()), ("hash", pa.string()), ("label", pa.string()),
    ("setting", pa.string()), ("variant", pa.string()), ("seed", pa.int64()),
    ("overrides", pa.string()), ("axes", pa.string()), ("status", pa.string()),
    ("run_dir", pa.string()), ("seconds", pa.float64()), ("message", pa.string()),
    ("engine", pa.string()), ("nodes", pa.string()), ("updated", pa.string()),
])
ADDED_LATER = ("axes",)  # columns an index written by an earlier version lacks (read as null)


class SweepIndexError(ValueError):
    """An index file that cannot be read; the message names the file."""


def read_index(sweep_dir: Path) -> list[dict[str, Any]]:
    path = sweep_dir / INDEX_FILE
    if not path.exists():
        return []
    try:
        # One open file: the writer replaces the index by a rename, and a path read may take
        # the size of one version and the bytes of the next (pyarrow stats, then reopens).
        with path.open("rb") as source:
            table = pq.read_table(pa.BufferReader(source.read()))
    except (pa.ArrowInvalid, OSError) as err:
        raise SweepIndexError(f"{path} is not a readable sweep index ({err}); move it away to start "
                          "the sweep's bookkeeping afresh (finished run directories are kept)") from None
    missing = sorted(set(SCHEMA.names) - set(table.column_names) - set(ADDED_LATER))
    if missing:
        raise SweepIndexError(f"{path} lacks the columns {missing}: not a sweep index of this version")
    return [{**dict.fromkeys(ADDED_LATER), **row} for row in table.to_pylist()]


class SweepIndex:
    """The rows of the current sweep's points, by config hash; thread-safe."""

    def __init__(self, sweep_dir: Path, points: Sequence[Point], engine: str) -> None:
        self.path = sweep_dir / INDEX_FILE
        self.engine = engine
        self._lock = threading.Lock()
        previous = {row["hash"]: row for row in read_index(sweep_dir)}
        self.rows: dict[str, dict[str, Any]] = {}
        for point in points:
            row = {"point": point.index, "hash": point.hash, "label": point.label,
                   "setting": point.setting, "variant": point.variant, "seed": point.seed,
                   "overrides": point.overrides_json(), "axes": point.axes_json(), "status": "pending",
                   "run_dir": point.run_dir.name, "seconds": None, "message": None,
                   "engine": engine, "nodes": None, "updated": None}
            old = previous.get(point.hash)
            if old is not None:  # resume by hash: keep what happened to this experiment
                row.update({k: old[k] for k in ("status", "seconds", "message", "engine", "nodes",
                                                "updated")})
            self.rows[point.hash] = row

    def finished(self, point: Point) -> bool:
        """Done and its outputs still there (a deleted run directory runs again)."""
        row = self.rows[point.hash]
        return row["status"] == "done" and (point.run_dir / "report").is_dir() and (
            point.run_dir / "summary.json").exists()

    def todo(self, points: Sequence[Point], retry_failed: bool) -> list[Point]:
        return [p for p in points if not self.finished(p)
                and (retry_failed or self.rows[p.hash]["status"] != "failed")]

    def mark(self, point: Point, status: str, seconds: float | None = None,
             message: str | None = None, nodes: dict[str, Any] | None = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown point status {status!r}; allowed: {', '.join(STATUSES)}")
        with self._lock:
            self.rows[point.hash].update({
                "status": status, "seconds": seconds, "message": message, "engine": self.engine,
                "nodes": json.dumps(nodes) if nodes else None,
                "updated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")})
            self._write()

    def write(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        rows = sorted(self.rows.values(), key=lambda r: r["point"])
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        write_atomically(self.path, lambda tmp: pq.write_table(table, tmp))

    def counts(self) -> dict[str, int]:
        with self._lock:
            statuses = [r["status"] for r in self.rows.values()]
        return {s: statuses.count(s) for s in STATUSES if statuses.count(s)}
