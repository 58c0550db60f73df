"""label_party/metrics.jsonl read once into what its readers use: the train records' per-step
series as arrays (a record held as a dict costs 1-2 KB; a paper-length run has 150,000), the
few other records (plan, evaluations) as dicts."""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from splitleak.artifacts.metrics import MetricsError, read_metrics
from splitleak.pace import RunClock, StepClock, median_step_ms, utility_curve

DEFENSE_PREFIX = "defense."  # a train record's "defense.<party>": that party's defense diagnostics
AUC_BOUND_SUFFIX = "auc_bound"  # a diagnostic bounding every attack's AUC (Marvell's Theorem 1)


class StepBounds(Mapping[int, float]):
    """One party's step -> AUC bound, as two arrays in the order the steps first appear (a dict
    held about 100 bytes a step)."""

    def __init__(self, steps: np.ndarray, bounds: np.ndarray) -> None:
        self.steps, self.bounds = steps, bounds
        self._order = np.argsort(steps, kind="stable")

    def __getitem__(self, step: int) -> float:
        at = int(np.searchsorted(self.steps, step, sorter=self._order))
        if at < self.steps.size and self.steps[self._order[at]] == step:
            return float(self.bounds[self._order[at]])
        raise KeyError(step)

    def __iter__(self) -> Iterator[int]:
        return iter(self.steps.tolist())

    def __len__(self) -> int:
        return int(self.steps.size)


@dataclass(frozen=True)
class MetricsLog:
    """What the analysis, the report and the comparison read of metrics.jsonl."""

    steps: np.ndarray  # int64: each train record's step, in file order
    loss: np.ndarray  # float64: its loss, NaN where null or absent
    step_seconds: np.ndarray  # float64: the train steps' wall-clock seconds (pace.StepClock)
    trained_seconds: float | None  # how long it trained, evaluations included (pace.RunClock)
    resumes: int  # how many times its clock started again (a resumed run)
    auc_bounds: dict[int, StepBounds]  # party -> step -> the lowest AUC bound its defenses logged
    others: list[dict[str, Any]]  # every other record, in file order
    others_seconds: list[float | None]  # each one's time on the whole run's clock (RunClock)

    @classmethod
    def of(cls, records: Iterable[dict[str, Any]], source: str = "metrics") -> MetricsLog:
        """The log of `records` (read_metrics' order); MetricsError naming `source` and the line
        for a train record without an integer step or with a bound that is not a number."""
        return _Collector(source).collect(records)

    @property
    def empty(self) -> bool:
        """No record at all (no metrics.jsonl, or an empty one)."""
        return not self.steps.size and not self.others

    @property
    def train_steps(self) -> int:
        return int(self.steps.size)

    @property
    def plans(self) -> list[dict[str, Any]]:
        return [r for r in self.others if r.get("type") == "plan"]

    @property
    def plan(self) -> dict[str, Any]:
        """The first plan record ({} when none)."""
        return next(iter(self.plans), {})

    @property
    def evals(self) -> list[dict[str, Any]]:
        return [r for r in self.others if r.get("type") == "eval"]

    def utility_curve(self, metric: str) -> list[tuple[float, float]]:
        """pace.utility_curve of the whole log: each evaluation's time on the run's clock."""
        return utility_curve([{**r, "wall": t} for r, t in zip(self.others, self.others_seconds,
                                                               strict=True)
                              if r.get("type") == "eval" and t is not None], metric)

    @property
    def ms_per_step(self) -> float | None:
        """The median train step in milliseconds (None without two consecutive train records)."""
        return median_step_ms(self.step_seconds.tolist())


class _Collector:
    """Builds a MetricsLog in one pass, holding arrays, never the train records."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.steps, self.loss = array("q"), array("d")
        self.clock = StepClock()
        self.run_clock = RunClock()
        self.bounds: dict[int, tuple[array, array]] = defaultdict(lambda: (array("q"), array("d")))
        self.others: list[dict[str, Any]] = []
        self.others_seconds: list[float | None] = []

    def collect(self, records: Iterable[dict[str, Any]]) -> MetricsLog:
        for line, record in enumerate(records, start=1):
            self.clock.add(record)
            seconds = self.run_clock.add(record)
            if record.get("type") == "train":
                self._train(record, f"{self.source} line {line}")
            else:
                self.others.append(record)
                self.others_seconds.append(seconds)
        bounds = {party: _step_bounds(steps, values) for party, (steps, values) in self.bounds.items()}
        return MetricsLog(_numbers(self.steps), _numbers(self.loss), _numbers(self.clock.seconds),
                          self.run_clock.seconds, self.run_clock.resumes, bounds, self.others,
                          self.others_seconds)

    def _train(self, record: dict[str, Any], where: str) -> None:
        step, loss = record.get("step"), record.get("loss")
        if isinstance(step, bool) or not isinstance(step, int):
            raise MetricsError(f"{where}: a train record's \"step\" is its integer number, got {step!r}")
        self.steps.append(step)
        self.loss.append(np.nan if loss is None else loss)
        for key, diagnostics in record.items():
            if key.startswith(DEFENSE_PREFIX) and isinstance(diagnostics, dict):
                bound = _lowest_bound(diagnostics, key, where)
                if bound is not None:
                    steps, values = self.bounds[_party(key, where)]
                    steps.append(step)
                    values.append(bound)


def _lowest_bound(diagnostics: dict[str, Any], key: str, where: str) -> float | None:
    """The lowest AUC bound among a party's diagnostics (each defense of the chain may log
    one; every attack's AUC is below each), None when none logged one."""
    values = [v for k, v in diagnostics.items() if k.endswith(AUC_BOUND_SUFFIX) and v is not None]
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise MetricsError(f"{where}: the AUC bounds in {key!r} must be numbers or null, got {values!r}")
    return min(values) if values else None


def _party(key: str, where: str) -> int:
    try:
        return int(key.removeprefix(DEFENSE_PREFIX))
    except ValueError:
        raise MetricsError(f"{where}: {key!r} must name a party by its number, as "
                           "\"defense.1\"") from None


def _step_bounds(steps: array, values: array) -> StepBounds:
    """A step logged twice keeps its last bound, at the place it first appeared (a dict's rule)."""
    found, bounds = _numbers(steps), _numbers(values)
    if (found[1:] > found[:-1]).all():
        return StepBounds(found, bounds)
    unique, first = np.unique(found, return_index=True)
    last = found.size - 1 - np.unique(found[::-1], return_index=True)[1]
    order = np.argsort(first, kind="stable")
    return StepBounds(unique[order], bounds[last[order]])


def _numbers(column: array) -> np.ndarray:
    """The array's numbers as int64 or float64, without a copy."""
    return np.frombuffer(column, dtype=np.int64 if column.typecode == "q" else np.float64)


def read_metrics_log(path: Path) -> MetricsLog:
    """The MetricsLog of a metrics file, read as a stream (empty when there is no file);
    MetricsError as read_metrics, naming the file and line."""
    return MetricsLog.of(read_metrics(path) if path.exists() else [], str(path))
