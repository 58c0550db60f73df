"""The local engine: points run concurrently on this machine, each a worker process that runs
the point's N+2 party processes on free loopback ports (port 0) and then its analysis."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from orchestration.processes import Child, spawn, stop_all
from orchestration.sweep.engine import (
    POINT_LOG,
    Engine,
    Listener,
    PointResult,
    ResumeRefused,
    default_jobs,
    log_line,
    refused_result,
    resume_run_dir,
)
from orchestration.sweep.points import Point
from splitleak.artifacts.metrics import MetricsTail
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.sweep import read_result
from splitleak.interrupts import interrupts_held
from splitleak.placement import CORES_ENV, cores
from splitleak.stopping import stopped_by


@dataclass
class _Running:
    point: Point
    child: Child
    tail: MetricsTail
    started: float


class LocalEngine(Engine):
    name = "local"
    worker_flags: tuple[str, ...] = ()  # how the point's worker trains (default: distributed)
    # Why a point's earlier attempt cannot resume from its checkpoint here (None: it resumes, as
    # splitleak run --resume does)
    no_checkpoints: str | None = None

    def __init__(self, jobs: int | None = None, poll: float = 0.2, stop_grace: float = 15.0) -> None:
        if jobs is not None and jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {jobs}")
        self.jobs = jobs or default_jobs()
        self.poll = poll
        self.stop_grace = stop_grace  # a worker's own parties get 5 s to stop within this

    def run(self, points: Sequence[Point], listener: Listener) -> dict[str, PointResult]:
        queue = deque(points)
        running: dict[str, _Running] = {}
        results: dict[str, PointResult] = {}
        try:
            while queue or running:
                while queue and len(running) < self.jobs:
                    point = queue.popleft()
                    try:
                        running[point.hash] = self._start(point)
                    except ResumeRefused as err:  # fails, its checkpoints kept
                        listener.started(point)
                        results[point.hash] = refused_result(point, err)
                        listener.finished(point, results[point.hash])
                        continue
                    listener.started(point)
                for key, job in list(running.items()):
                    for record in job.tail.read_new():
                        listener.record(job.point, record)
                    if job.child.returncode is not None:
                        results[key] = self._result(job)
                        listener.finished(job.point, results[key])
                        del running[key]
                time.sleep(self.poll)
        except KeyboardInterrupt as err:
            with interrupts_held():  # a second Ctrl-C must not cut the stop (bounded) short
                stop_all([job.child for job in running.values()], grace=self.stop_grace)
                for key, job in running.items():
                    if key not in results:  # else it ended before the stop: recorded again
                        results[key] = PointResult("interrupted", time.monotonic() - job.started,
                                                   stopped_by(err))
                    listener.finished(job.point, results[key])
            raise
        return results

    def _start(self, point: Point) -> _Running:
        run, flags = self.prepare(point)
        # The points share the cores: a point's roles divide its share ("auto" threads).
        share = str(max(1, cores() // self.jobs))
        child = spawn(f"sweep point {point.label}",
                      ["orchestration.sweep.worker", str(run.root), *(flags or self.worker_flags)],
                      run.logs / POINT_LOG, env={CORES_ENV: share})
        return _Running(point, child, MetricsTail(RunDir(run.root).metrics), time.monotonic())

    def prepare(self, point: Point) -> tuple[RunDir, tuple[str, ...]]:
        """The point's run directory for this attempt and the worker's flags for it (a trained
        point is only analysed; see resume_run_dir); the point's log says why so."""
        run, flags, note = resume_run_dir(point, self.no_checkpoints)
        if note is not None:
            log_line(run.logs / POINT_LOG, note)
        return run, flags

    def _result(self, job: _Running) -> PointResult:
        seconds = time.monotonic() - job.started
        result = read_result(job.point.run_dir)
        if result is None:  # the worker died before it could say why
            reason = job.child.last_error() or job.child.log_tail(5)
            return PointResult("failed", seconds, f"point worker {job.child.how_it_ended()}"
                                                  + (f": {reason}" if reason else ""))
        return PointResult(result.status, seconds, result.message, result.nodes)
