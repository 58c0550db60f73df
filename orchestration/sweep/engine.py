"""The seam between a sweep and where its points run: an Engine takes points, returns results.

`local` (orchestration.sweep.local) runs points as processes on this machine; `inprocess`
(orchestration.sweep.inprocess) trains each with the in-process reference, the same numbers
without party processes; `ray` (orchestration.sweep.ray_engine, the only module importing Ray)
places each point's roles on a Ray cluster. All leave the same run directory per point, named
by its config hash.
"""

from __future__ import annotations

import logging
import shutil
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from orchestration.sweep.points import Point
from splitleak.artifacts.metrics import truncate_records
from splitleak.artifacts.outcome import read_outcome
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import write_config

# read_result and write_result: the engines' names for a point's result file
from splitleak.artifacts.sweep import PointResult
from splitleak.artifacts.sweep import read_result as read_result
from splitleak.artifacts.sweep import write_result as write_result
from splitleak.cli_common import LOG_FORMAT
from splitleak.config import ConfigError
from splitleak.placement import cores

POINT_LOG = "sweep_point.log"  # a point's engine and worker lines, in its logs/


class EngineError(ValueError):
    """The engine cannot run these points as asked (e.g. --spread on too few nodes)."""


class ResumeRefused(Exception):
    """A point's earlier attempt holds a checkpoint that must be neither resumed (its data files
    changed, or its gradient log is gone) nor thrown away by starting again from step 0: the
    point fails, naming why, and its run directory is left as it is."""


class Listener(Protocol):
    """What an engine reports while it runs (called from any thread)."""

    def started(self, point: Point) -> None: ...

    def record(self, point: Point, record: dict[str, Any]) -> None:
        """A metrics record of the point's label party (plan, train, eval), as it is written."""

    def finished(self, point: Point, result: PointResult) -> None: ...


class Engine(ABC):
    name: str
    jobs: int  # points run at the same time

    def at_a_time(self) -> str:
        """How many points run at once, in words (for the sweep's banner)."""
        return f"{self.jobs} at a time"

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


def prepare_run_dir(point: Point, keep_logs: bool = False) -> RunDir:
    """A fresh run directory for the point (what an earlier attempt left is removed, but for its
    logs with `keep_logs`: the new attempt's are appended)."""
    if point.run_dir.exists():
        for path in point.run_dir.iterdir():
            if keep_logs and path.name == "logs" and path.is_dir() and not path.is_symlink():
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    run = RunDir(point.run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    write_config(point.config, run)
    return run


def resume_run_dir(point: Point, no_checkpoints: str | None = None, data_here: bool = True
                   ) -> tuple[RunDir, tuple[str, ...], str | None]:
    """The run directory for another attempt at the point: the earlier attempt's, to resume (as
    `splitleak run --resume` does) when it holds a usable checkpoint, or to analyse when it was
    trained; else a fresh one with the earlier logs kept. `no_checkpoints`: why this engine
    cannot resume from a checkpoint (its point then starts again from step 0 unless trained).
    `data_here`: whether the data files the config names are checked here against the
    checkpoint's (not where the label party checks them on a node of its own).
    Also the worker's flags for it, and why so in words (None: no earlier attempt).
    ResumeRefused, with the run directory untouched, when the checkpoint is whole but its data
    files changed or its gradient log is gone (a fresh start would discard it)."""
    from splitleak.checkpoint import (
        CheckpointError,
        DataChanged,
        discard_after,
        latest,
        missing_log,
        resume_point,
    )

    run = RunDir(point.run_dir)
    if not run.config.is_file():
        return prepare_run_dir(point), (), None
    trained = read_outcome(run).get("status") == "ok"
    if trained and run.summary.is_file():
        run.point_result.unlink(missing_ok=True)
        return run, ("--analysis-only",), "its earlier attempt finished training: analysing it"
    # trained without summary.json: stopped while its processes ended, before they were collected
    manifest, why = None, no_checkpoints or "its earlier attempt left no complete checkpoint"
    if no_checkpoints is None and latest(run.root) is not None:
        try:
            manifest = resume_point(run.root, point.config, data=data_here, trained=trained,
                                    every_party=True)  # every role's run directory is this one
        except DataChanged as err:
            raise ResumeRefused(f"{err}; the point's checkpoints are kept") from None
        except (CheckpointError, ConfigError) as err:
            why = f"its checkpoints cannot be resumed from: {err}"
        problem = missing_log(run.root, manifest)  # the point's sidecar logs into its run dir
        if problem is not None:
            raise ResumeRefused(f"cannot resume {run.root}: {problem}")
    if manifest is None:
        return (prepare_run_dir(point, keep_logs=True), (),
                f"{why}; the point starts again from step 0")
    run.point_result.unlink(missing_ok=True)  # the earlier attempt's, never this one's
    if trained:  # an outcome that says ok would refuse the roles' resume
        run.outcome.unlink()
    # any newer checkpoint was passed over (a party's file gone from it): removed, so that
    # every role, the label party on any node included, resumes from this one
    discard_after(run.root, manifest.position)
    truncate_records(run.metrics, manifest.metrics_records)  # before anything tails them
    return run, ("--resume",), (f"resuming the point's earlier attempt at step "
                                f"{manifest.step} ({manifest.reason} checkpoint)")


def refused_result(point: Point, err: ResumeRefused, seconds: float = 0.0) -> PointResult:
    """The failed result of a point whose resume was refused, said in its log and result file."""
    result = PointResult("failed", seconds, f"resume refused: {err}")
    log_line(RunDir(point.run_dir).logs / POINT_LOG, result.message or "")
    write_result(point.run_dir, result)
    return result


def log_line(path: Path, message: str) -> None:
    """Append one INFO line to a point's log, formatted as its worker's own lines."""
    record = logging.LogRecord("sweep", logging.INFO, __file__, 0, message, None, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as log:
        log.write(logging.Formatter(LOG_FORMAT.format(role="sweep-point")).format(record) + "\n")
