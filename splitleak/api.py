"""The public Python API for notebooks: open a run or a sweep directory and get what it wrote
as typed artifacts and pandas DataFrames (needs pandas: `pip install splitleak[notebook]`).

    >>> sweep = open_sweep("runs/sweeps/tiny")
    >>> sweep.points        # one row per point: its axes, seed, status and outcome
    >>> sweep.comparison    # `splitleak compare`'s table
    >>> run = sweep.runs()[0]
    >>> run.leaks           # the per-batch leak rows of `attacker analyze`
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from splitleak.artifacts.metrics import read_metrics
from splitleak.artifacts.outcome import Outcome, OutcomeError, read_outcome_model_or_refuse
from splitleak.artifacts.paths import CompareDir, RunDir, SweepDir, is_run_dir, is_sweep_dir
from splitleak.artifacts.run_config import edited_config
from splitleak.artifacts.summary import LeakSummary, SummaryError, read_leak_summary
from splitleak.artifacts.sweep import STATUSES, read_index_rows
from splitleak.artifacts.timing import read_timing_model
from splitleak.config import ExperimentConfig, load_config

if TYPE_CHECKING:
    import pandas as pd


class TableError(ValueError):
    """A table of a run or sweep directory that is missing or unreadable; the message names the
    file and what writes it."""


def read_table(path: Path, what: str, writer: str) -> pd.DataFrame:
    """The parquet table at `path` as a DataFrame; TableError naming the file, `what` it is and
    the `writer` that makes it, when it is missing or not a parquet table."""
    try:
        return pq.read_table(path).to_pandas()
    except FileNotFoundError:
        raise TableError(f"{path} does not exist: no {what} yet ({writer})") from None
    except (OSError, pa.ArrowInvalid) as err:
        raise TableError(f"{path} is not a readable {what} ({err}); {writer} again") from None


@dataclass(frozen=True)
class Run:
    """A run directory, read lazily: each property reads its file on first use and keeps what
    it read (a running run's: a snapshot; open it again to read on), but `outcome`, which is
    read again until the run has ended."""

    dir: RunDir

    @property
    def root(self) -> Path:
        return self.dir.root

    @cached_property
    def config(self) -> ExperimentConfig:
        """The run's config; a UserWarning when config.toml was edited since the run wrote it."""
        cfg = load_config(self.dir.config)
        for edited in edited_config(self.dir, cfg):
            warnings.warn(edited, stacklevel=3)  # the caller of .config
        return cfg

    @property
    def outcome(self) -> Outcome | None:
        """How the run ended (None while it runs, or if it was killed before concluding: read
        again on each use until the run has one, then kept); OutcomeError (a ValueError) naming
        the file when outcome.json is there but unreadable, as `attacker analyze` refuses it."""
        ended = self.__dict__.get("_outcome")  # a frozen dataclass: set as cached_property does
        if ended is None:
            ended = self.__dict__["_outcome"] = read_outcome_model_or_refuse(self.dir)
        return ended

    @cached_property
    def summary(self) -> LeakSummary:
        """The run-level leak entries (report/summary.json; `attacker analyze` writes it);
        SummaryError naming the file, and what writes it when the run was not analysed."""
        if not self.dir.leak_summary.exists():
            raise SummaryError(f"{self.dir.leak_summary} does not exist: no leak summary yet "
                               f"(`attacker analyze {self.root}` writes it)")
        return read_leak_summary(self.dir)

    @cached_property
    def metrics(self) -> pd.DataFrame:
        """The label party's records (plan, train, eval), one row each; nested diagnostics
        (a defense's) flattened to dotted columns."""
        import pandas as pd

        return pd.json_normalize(list(read_metrics(self.dir.metrics)))

    @cached_property
    def leaks(self) -> pd.DataFrame:
        """The per-batch leak rows (one per party, layer, attack, step and draw); TableError
        naming the file when the run was not analysed or its table is unreadable."""
        return read_table(self.dir.leak, "leak table",
                          f"`attacker analyze {self.root}` writes it")

    @cached_property
    def timing(self) -> pd.DataFrame:
        """Where each role's time went: one row per (role, span) of the timing.json files the
        roles wrote (label party, each passive party, the sidecar), with seconds, count and ms
        per train step; a role that wrote none has no rows."""
        import pandas as pd

        files = {"label party": self.dir.label_timing, "attacker": self.dir.attacker_timing}
        files |= {f"passive party {k}": self.dir.passive_timing(k)
                  for k in range(1, self.config.topology.passive_parties + 1)}
        rows = []
        for role, path in files.items():
            timing = read_timing_model(path)
            for name, span in (timing.spans if timing is not None else {}).items():
                rows.append({"role": role, "span": name, **span.model_dump()})
        return pd.DataFrame(rows, columns=["role", "span", "seconds", "count", "ms_per_step"])


@dataclass(frozen=True)
class Sweep:
    """A sweep directory: its index, its points' runs and its comparison."""

    dir: SweepDir

    @property
    def root(self) -> Path:
        return self.dir.root

    @cached_property
    def points(self) -> pd.DataFrame:
        """One row per point: index, label, setting, variant, each axis (a column named by its
        config path), seed, status, seconds, message, run directory, and the label party's
        outcome status."""
        import pandas as pd

        rows = []
        for row in read_index_rows(self.root):
            outcome = _point_outcome(self.dir.point(row.run_dir), row.status)
            rows.append({"point": row.point, "label": row.label, "setting": row.setting,
                         "variant": row.variant, **(row.axes_dict() or {}), "seed": row.seed,
                         "status": row.status, "seconds": row.seconds, "message": row.message,
                         "run_dir": row.run_dir,
                         "outcome": outcome.status if outcome is not None else None})
        return pd.DataFrame(rows)

    @cached_property
    def comparison(self) -> pd.DataFrame:
        """`splitleak compare`'s table (one row per setting and attack), as it wrote it;
        TableError naming the file when the sweep was not compared or its table is unreadable."""
        return read_table(CompareDir(self.dir.compare).table_parquet, "comparison table",
                          f"`splitleak compare {self.root}` writes it; `splitleak sweep` runs it "
                          "at its end once some point is done, unless --no-compare")

    def runs(self, status: str | None = "done") -> list[Run]:
        """The points' runs in point order (`status`: only those with it; None: every point but
        a pending one not started, which has no run directory yet). ValueError naming the point
        and the directory when the index lists a started point whose run directory is gone;
        ValueError naming the statuses a point can have for any other `status`."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status={status!r} is no sweep point's status: one of "
                             f"{', '.join(map(repr, STATUSES))}, or None for every started point "
                             "(how a run ended, e.g. 'ok', is the outcome column of Sweep.points)")
        runs = []
        for row in read_index_rows(self.root):
            if status is not None and row.status != status:
                continue
            run = self.dir.point(row.run_dir)
            if not is_run_dir(run.root):
                if row.status == "pending":
                    continue
                gone = f"has no {run.config.name}" if run.root.is_dir() else "does not exist"
                raise ValueError(f"point {row.point} ({row.label}) of the sweep {self.root} is "
                                 f"{row.status} in {self.dir.index.name}, but its run directory "
                                 f"{run.root} {gone} (moved or deleted?); Sweep.points lists "
                                 "each point's run_dir")
            runs.append(Run(run))
        return runs


def _point_outcome(run: RunDir, status: str) -> Outcome | None:
    """A point's outcome; None, with a UserWarning naming the file, when it is unreadable, or
    naming the directory when a started point's is gone (one damaged point does not hide the
    others, nor passes for one still running unsaid)."""
    if status != "pending" and not run.root.is_dir():
        warnings.warn(f"{run.root} does not exist, though the sweep index says its point is "
                      f"{status}; its outcome is left empty in Sweep.points", stacklevel=4)
        return None
    try:
        return read_outcome_model_or_refuse(run)
    except OutcomeError as err:
        warnings.warn(f"{err}; its outcome is left empty in Sweep.points", stacklevel=4)
        return None


def open_run(path: str | Path) -> Run:
    """The run directory at `path` (ValueError when it is none)."""
    root = Path(path)
    if not is_run_dir(root):
        raise ValueError(f"{root} is not a run directory (it has no {RunDir(root).config.name})")
    return Run(RunDir(root))


def open_sweep(path: str | Path) -> Sweep:
    """The sweep directory at `path` (ValueError when it is none)."""
    root = Path(path)
    if not is_sweep_dir(root):
        raise ValueError(f"{root} is not a sweep directory (it has no {SweepDir(root).index.name})")
    return Sweep(SweepDir(root))
