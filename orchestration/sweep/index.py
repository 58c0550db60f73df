"""sweep.parquet: one row per point (overrides, status, run directory, seconds), rewritten
atomically after every change so an interrupted sweep always leaves a readable index."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestration.sweep.points import Point
from splitleak.artifacts.paths import RunDir, SweepDir
from splitleak.artifacts.sweep import (
    STATUSES,
    read_index_rows,
    read_result,
    write_index_rows,
)


def read_index(sweep_dir: Path) -> list[dict[str, Any]]:
    """The index's rows as dicts ([] when the sweep has none; splitleak.artifacts.sweep)."""
    return [row.model_dump() for row in read_index_rows(sweep_dir)]


class SweepIndex:
    """The rows of the current sweep's points, by config hash; thread-safe."""

    def __init__(self, sweep_dir: Path, points: Sequence[Point], engine: str) -> None:
        self.path = SweepDir(sweep_dir).index
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
            elif (kept := read_result(point.run_dir)) is not None and kept.status == "done":
                # a point the sweep file left out for a while and has again: its run is there
                row.update(status="done", seconds=kept.seconds, message=kept.message,
                           nodes=json.dumps(kept.nodes) if kept.nodes else None)
            self.rows[point.hash] = row
        # the earlier file's points this one no longer has (edited): out of the index, their
        # run directories kept (a point named again is found there)
        self.left_out = [row for key, row in previous.items() if key not in self.rows]

    def finished(self, point: Point) -> bool:
        """Done and its outputs still there (a deleted run directory runs again)."""
        row, run = self.rows[point.hash], RunDir(point.run_dir)
        return row["status"] == "done" and run.report.is_dir() and run.summary.exists()

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
        write_index_rows(self.path.parent, sorted(self.rows.values(), key=lambda r: r["point"]))

    def counts(self) -> dict[str, int]:
        with self._lock:
            statuses = [r["status"] for r in self.rows.values()]
        return {s: statuses.count(s) for s in STATUSES if statuses.count(s)}
