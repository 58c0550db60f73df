"""Statistics over seeds: mean with a 95 % t interval clipped to the metric's range, and GAFM's
mean / worst / best."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
UNBOUNDED = (-math.inf, math.inf)
PROBABILITY = (0.0, 1.0)  # AUC, accuracy, DCS, utility: where their intervals are clipped


@dataclass(frozen=True)
class OverSeeds:
    """One number of one setting over its seeds."""

    n: int
    mean: float
    ci_low: float  # Student-t interval over seeds; NaN with fewer than 2 seeds
    ci_high: float
    worst: float
    best: float
    ci_clipped: str = ""  # "low", "high" or "both": the end(s) the metric's range cut

    def columns(self, prefix: str) -> dict[str, float | int | str]:
        return {f"{prefix}_{k}": getattr(self, k)
                for k in ("mean", "ci_low", "ci_high", "worst", "best", "ci_clipped")}


def over_seeds(values: Sequence[float | None], higher_is_better: bool,
               bounds: tuple[float, float] = UNBOUNDED) -> OverSeeds | None:
    """None when no seed has the value. worst/best follow the direction (for a leak, lower is
    better; for utility, higher). The interval is clipped to `bounds`, the metric's range (an
    AUC's t interval over two seeds can reach 1.07), and `ci_clipped` says at which end."""
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
    cut = [end for end, outside in (("low", low < bounds[0]), ("high", high > bounds[1])) if outside]
    low, high = max(low, bounds[0]), min(high, bounds[1])
    return OverSeeds(int(array.size), mean, float(low), float(high), float(worst), float(best),
                     "both" if len(cut) == 2 else "".join(cut))
