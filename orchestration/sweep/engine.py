"""The seam between a sweep and where its points run: an Engine takes points, returns results.

`local` (orchestration.sweep.local) runs points as processes on this machine; `inprocess`
(orchestration.sweep.inprocess) trains each with the in-process reference, the same numbers
without party processes; `ray` (orchestration.sweep.ray_engine, the only module importing Ray)
places each point's roles on a Ray cluster. All leave the same run directory per point, named
by its config hash.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

from orchestration.sweep.points import Point
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import write_config

# read_result and write_result: the engines' names for a point's result file
from splitleak.artifacts.sweep import PointResult
from splitleak.artifacts.sweep import read_result as read_result
from splitleak.artifacts.sweep import write_result as write_result
from splitleak.placement import cores


class EngineError(ValueError):
    """The engine cannot run these points as asked (e.g. --spread on too few nodes)."""


class Listener(Protocol):
    """What an engine reports while it runs (called from any thread)."""

    def started(self, point: Point) -> None: ...

    def record(self, point: Point, record: dict[str, Any]) -> None:
        """A metrics record of the point's label party (plan, train, eval), as it is written."""

    def finished(self, point: Point, result: PointResult) -> None: ...


class Engine(ABC):
    name: str
    jobs: int  # points run at the same time

    @abstractmethod
    def run(self, points: Sequence[Point], listener: Listener) -> dict[str, PointResult]:
        """Run every point into its run directory; results by config hash. On KeyboardInterrupt
        stop every process of every running point, report those points as interrupted, and
        re-raise."""


def default_jobs(processes_per_point: float = 1.0) -> int:
    """Points the cores hold: a point's processes take turns within a synchronous step, so
    together they keep about one core busy (and so each point runs with one core's threads:
    the small models of a sweep gain less from threads than from running side by side)."""
    return max(1, int(cores() // processes_per_point))


def prepare_run_dir(point: Point) -> RunDir:
    """A fresh run directory for the point (what an earlier attempt left is removed)."""
    if point.run_dir.exists():
        shutil.rmtree(point.run_dir)
    run = RunDir(point.run_dir)
    run.root.mkdir(parents=True)
    write_config(point.config, run)
    return run
