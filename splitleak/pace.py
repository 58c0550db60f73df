"""How fast a run trained: time per train step and time to a utility, from metrics.jsonl's clock."""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median
from typing import Any


def step_seconds(records: Iterable[dict[str, Any]]) -> list[float]:
    """Wall-clock seconds of each train step: the time between consecutive train records, left
    out where an evaluation pass sits between them or the clock restarted (a resumed run)."""
    out, previous = [], None
    for record in records:
        kind, wall = record.get("type"), record.get("wall")
        if kind == "eval":
            previous = None
        elif kind == "train" and isinstance(wall, int | float):
            if previous is not None and wall > previous:
                out.append(wall - previous)
            previous = wall
    return out


def ms_per_step(records: Iterable[dict[str, Any]]) -> float | None:
    """The median train step in milliseconds (None without two consecutive train records)."""
    seconds = step_seconds(records)
    return 1000 * median(seconds) if seconds else None


def utility_curve(records: Iterable[dict[str, Any]], metric: str) -> list[tuple[float, float]]:
    """(seconds since training began, metric) of each evaluation that scored `metric`."""
    return [(float(r["wall"]), float(r[metric])) for r in records
            if r.get("type") == "eval" and isinstance(r.get(metric), int | float)
            and isinstance(r.get("wall"), int | float)]


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """Seconds until the first evaluation at or above `target` (None if none reached it)."""
    return next((wall for wall, value in curve if value >= target), None)
