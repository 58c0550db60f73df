"""The seam between a sweep and where its points run: an Engine takes points, returns results.

`local` (orchestration.sweep.local) runs points as processes on this machine; `inprocess`
(orchestration.sweep.inprocess) trains each with the in-process reference, the same numbers
without party processes; `ray` (orchestration.sweep.ray_engine, the only module importing Ray)
places each point's roles on a Ray cluster. All leave the same run directory per point, named
by its config hash.
"""

from __future__ import annotations

import json
import shutil
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from orchestration.sweep.index import RESULT_FILE
from orchestration.sweep.points import Point
from splitleak.fileio import write_atomically
from splitleak.placement import cores
from splitleak.rundir import RunDir, write_config

Status = Literal["done", "failed", "interrupted"]


class EngineError(ValueError):
    """The engine cannot run these points as asked (e.g. --spread on too few nodes)."""


@dataclass(frozen=True)
class PointResult:
    status: Status
    seconds: float  # wall time of the point as its engine saw it (start-up and analysis included)
    message: str | None = None  # why it failed
    nodes: dict[str, Any] | None = None  # where each role ran (engines that place roles)


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


def write_result(run_dir: Path, result: PointResult) -> None:
    text = json.dumps(asdict(result), indent=2)
    write_atomically(run_dir / RESULT_FILE, lambda tmp: tmp.write_text(text))


def read_result(run_dir: Path) -> PointResult | None:
    try:
        return PointResult(**json.loads((run_dir / RESULT_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None
