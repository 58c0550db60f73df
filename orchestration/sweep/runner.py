"""A sweep from its points to its index: skip what is done, run the rest on an engine, keep
sweep.parquet true at every moment (Ctrl-C included), show progress over points."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from orchestration.sweep.engine import Engine, PointResult
from orchestration.sweep.index import SweepIndex
from orchestration.sweep.points import Point


@dataclass
class SweepOutcome:
    points: int
    skipped: int  # finished earlier (resume by hash) or failed earlier and not retried
    results: dict[str, PointResult] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # statuses in the index afterwards

    def failed(self) -> dict[str, PointResult]:
        return {k: r for k, r in self.results.items() if r.status == "failed"}


class SweepProgress:
    """One bar over the points, plus one bar of train steps per running point."""

    def __init__(self, index: SweepIndex, total: int, console: Console | None, enabled: bool) -> None:
        self.index = index
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                                 TimeElapsedColumn(), console=console, disable=not enabled)
        self.overall = self.progress.add_task("points", total=total, note="")
        self._points: dict[str, TaskID] = {}
        self._lock = threading.Lock()
        self._failed = 0

    def __enter__(self) -> SweepProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def started(self, point: Point) -> None:
        self.index.mark(point, "running")
        with self._lock:
            self._points[point.hash] = self.progress.add_task(point.label, total=None, note="starting")

    def record(self, point: Point, record: dict[str, Any]) -> None:
        with self._lock:
            task = self._points.get(point.hash)
            if task is None:
                return
            if record.get("type") == "plan":
                self.progress.update(task, total=record["total_train_steps"], note="training")
            elif record.get("type") == "train":
                self.progress.update(task, completed=record["step"] + 1,
                                     note=f"loss {record['loss']:.4f}")

    def finished(self, point: Point, result: PointResult) -> None:
        self.index.mark(point, result.status, result.seconds, result.message, result.nodes)
        with self._lock:
            task = self._points.pop(point.hash, None)
            if task is not None:
                self.progress.remove_task(task)
            self._failed += result.status == "failed"
            self.progress.update(self.overall, advance=1 if result.status != "interrupted" else 0,
                                 note=f"[red]{self._failed} failed[/]" if self._failed else "")
        if result.status == "failed":
            self.progress.console.print(f"[red]point failed[/] {point.label}: {result.message}")


def run_points(points: Sequence[Point], index: SweepIndex, engine: Engine, *,
               retry_failed: bool = False, console: Console | None = None,
               show_progress: bool = True) -> SweepOutcome:
    """Run the points that are not finished; on Ctrl-C the engine stops every running point,
    the index says which were interrupted, and KeyboardInterrupt propagates."""
    todo = index.todo(points, retry_failed)
    index.write()
    outcome = SweepOutcome(len(points), len(points) - len(todo))
    with SweepProgress(index, len(todo), console, show_progress) as progress:
        try:
            outcome.results = engine.run(todo, progress)
        finally:
            outcome.counts = index.counts()
    return outcome
