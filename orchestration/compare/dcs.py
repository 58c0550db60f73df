"""VFLAIR's Defense Capability Score (DCS, T-DCS, C-DCS) and our chance-normalised DCS.

DCS = 1 / (1 + sqrt((1 − β)·max(AP − AP*, 0)² + β·max(MP* − MP, 0)²)), β = 0.5, as VFLAIR's
`cal_dcs` (src/metrics/data_process.py): AP* = 0 (a perfect defense), MP* = the main-task
performance of the same set-up without a defense. T-DCS = mean DCS over the attacks of one
type; C-DCS = mean of the T-DCS over the types measured (VFLAIR's equal weights). Ours: the same
with AP* = chance (0.5 for an AUC, 1/K for a K-class accuracy), so a defense that brings an
attack down to guessing scores as if it stopped it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

BETA = 0.5


def dcs(ap: float, mp: float, mp_star: float, ap_star: float = 0.0, beta: float = BETA) -> float:
    gap_ap = max(ap - ap_star, 0.0)
    gap_mp = max(mp_star - mp, 0.0)
    return 1.0 / (1.0 + math.sqrt((1.0 - beta) * gap_ap ** 2 + beta * gap_mp ** 2))


def chance(metric: str, num_classes: int) -> float:
    """What guessing scores: AUC 0.5, K-class accuracy 1/K; a reconstruction metric (SSIM, R²,
    feature accuracy) has no guess independent of the data, so AP* stays 0."""
    if metric == "auc":
        return 0.5
    return 1.0 / num_classes if metric == "accuracy" else 0.0


def mean_of(values: Iterable[float | None]) -> float | None:
    """T-DCS from DCS, C-DCS from T-DCS: the plain mean of what was measured."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
