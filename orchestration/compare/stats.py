"""Statistics over seeds: mean with a 95 % t interval, and GAFM's mean / worst / best."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


@dataclass(frozen=True)
class OverSeeds:
    """One number of one setting over its seeds."""

    n: int
    mean: float
    ci_low: float  # Student-t interval over seeds; NaN with fewer than 2 seeds
    ci_high: float
    worst: float
    best: float

    def columns(self, prefix: str) -> dict[str, float | int]:
        return {f"{prefix}_{k}": getattr(self, k) for k in ("mean", "ci_low", "ci_high", "worst", "best")}


def over_seeds(values: Sequence[float | None], higher_is_better: bool) -> OverSeeds | None:
    """None when no seed has the value. worst/best follow the direction (for a leak, lower is
    better; for utility, higher)."""
    array = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if array.size == 0:
        return None
    mean = float(array.mean())
    if array.size < 2:
        low = high = math.nan
    else:
        sem = float(stats.sem(array))
        low, high = (mean, mean) if sem == 0 else stats.t.interval(
            CONFIDENCE, df=array.size - 1, loc=mean, scale=sem)
    worst, best = (array.min(), array.max()) if higher_is_better else (array.max(), array.min())
    return OverSeeds(int(array.size), mean, float(low), float(high), float(worst), float(best))
