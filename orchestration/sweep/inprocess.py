"""The in-process engine: each point trained by the in-process reference (no party processes,
no sockets) and analysed as the local engine's worker does, so its numbers are the local
engine's on the same point.

`--jobs` means what it means for local: points at a time, by default as many as the cores
(a point keeps one core busy). More than one: each point in a worker process, scheduled,
stopped and recorded exactly as local's. One: the points one after another in this process,
with nothing to start (a debugger or a traceback reaches the point's code; tests stay light);
the point's log still goes to its logs/sweep_point.log and its records to the progress bars.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence

from rich.console import Console

from orchestration.sweep.engine import Listener
from orchestration.sweep.local import POINT_LOG, LocalEngine
from orchestration.sweep.points import Point
from orchestration.sweep.worker import run_point
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.sweep import PointResult, write_result
from splitleak.cli_common import LOG_FORMAT, LibraryChatter
from splitleak.stopping import stopped_by


class InProcessEngine(LocalEngine):
    name = "inprocess"
    worker_flags = ("--in-process",)
    no_checkpoints = "the in-process reference writes no checkpoints"

    def run(self, points: Sequence[Point], listener: Listener) -> dict[str, PointResult]:
        if self.jobs > 1:
            return super().run(points, listener)
        results: dict[str, PointResult] = {}
        for point in points:
            results[point.hash] = self._run_here(point, listener)
        return results

    def _run_here(self, point: Point, listener: Listener) -> PointResult:
        """One point in this process; Ctrl-C marks it interrupted and propagates."""
        started = time.monotonic()
        listener.started(point)
        stop: KeyboardInterrupt | None = None
        try:
            run, flags = self.prepare(point)
            analysis_only = "--analysis-only" in flags
            with _point_log(run) as console:
                result = run_point(run, analysis_only, in_process=not analysis_only, console=console,
                                   on_record=lambda record: listener.record(point, record),
                                   propagate_stop=True)
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (sweep.engine.Terminated)
            stop = err
            result = PointResult("interrupted", time.monotonic() - started, stopped_by(err))
        result = PointResult(result.status, time.monotonic() - started, result.message)
        if point.run_dir.is_dir():
            write_result(point.run_dir, result)
        listener.finished(point, result)
        if stop is not None:
            raise stop
        return result


@contextlib.contextmanager
def _point_log(run: RunDir) -> Iterator[Console]:
    """While the point runs, this process logs to the point's log only (as its worker would),
    and the analysis prints there too: the terminal keeps the sweep's progress."""
    path = run.logs / POINT_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    kept, level = root.handlers[:], root.level
    with path.open("a") as log:
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter(LOG_FORMAT.format(role="sweep-point")))
        handler.addFilter(LibraryChatter())  # as a worker's own log: no findfont fallbacks
        root.handlers = [handler]
        root.setLevel(logging.INFO)
        try:
            yield Console(file=log, width=120)
        finally:
            root.handlers = kept
            root.setLevel(level)
