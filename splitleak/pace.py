"""How fast a run trained: time per train step and time to a utility, from metrics.jsonl's clock."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from statistics import median
from typing import Any


class StepClock:
    """The train steps' wall-clock seconds, fed a record at a time (a reader that keeps none):
    the time between consecutive train records, left out where an evaluation pass sits between
    them or the clock restarted (a resumed run)."""

    def __init__(self) -> None:
        self.seconds = array("d")
        self._previous: float | None = None

    def add(self, record: dict[str, Any]) -> None:
        kind, wall = record.get("type"), record.get("wall")
        if kind == "eval":
            self._previous = None
        elif kind == "train" and isinstance(wall, int | float):
            if self._previous is not None and wall > self._previous:
                self.seconds.append(wall - self._previous)
            self._previous = wall


class RunClock:
    """The seconds a run trained, from its records' clocks ("wall", seconds since the process's
    first batch), fed a record at a time: a clock that went back started again in a resumed
    process, whose seconds count on from the last record kept before it (the time between the
    kill and the resume is not counted, nor the work the resume redid after its checkpoint)."""

    def __init__(self) -> None:
        self.seconds: float | None = None  # the latest record's time on the whole run's clock
        self.resumes = 0  # how many times the clock started again
        self._offset = 0.0
        self._previous: float | None = None

    def add(self, record: dict[str, Any]) -> float | None:
        """The record's time on the whole run's clock (None: a record without one)."""
        wall = record.get("wall")
        if record.get("type") not in ("train", "eval") or isinstance(wall, bool) \
                or not isinstance(wall, int | float):
            return None
        if self._previous is not None and wall < self._previous:
            self._offset += self._previous
            self.resumes += 1
        self._previous = wall
        self.seconds = self._offset + wall if self.seconds is None \
            else max(self.seconds, self._offset + wall)
        return self._offset + wall


def median_step_ms(seconds: Sequence[float]) -> float | None:
    """The median of `seconds` in milliseconds (None when empty)."""
    return 1000 * median(seconds) if len(seconds) else None


def utility_curve(records: Iterable[dict[str, Any]], metric: str) -> list[tuple[float, float]]:
    """(seconds since training began, on the whole run's clock: RunClock, metric) of each
    evaluation that scored `metric`; `records` every record of the run, in its order (its
    evaluations alone cannot tell every resume)."""
    clock, curve = RunClock(), []
    for record in records:
        seconds = clock.add(record)
        value = record.get(metric)
        if record.get("type") == "eval" and seconds is not None and isinstance(value, int | float) \
                and not isinstance(value, bool):
            curve.append((seconds, float(value)))
    return curve


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """Seconds until the first evaluation at or above `target` (None if none reached it)."""
    return next((wall for wall, value in curve if value >= target), None)
