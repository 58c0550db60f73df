"""VFLAIR's Defense Capability Score (DCS, T-DCS, C-DCS), the attack performance it is computed
from, and our chance-normalised DCS.

DCS = 1 / (1 + sqrt((1 − β)·max(AP − AP*, 0)² + β·max(MP* − MP, 0)²)), β = 0.5, as VFLAIR's
`cal_dcs` (src/metrics/data_process.py): AP* = 0 (a perfect defense), MP* = the main-task
performance of the same set-up without a defense. T-DCS = mean DCS over the attacks of one
type that VFLAIR has (an entry naming VFLAIR's counterpart, LeakEntry.in_vflair: splitleak's
own attacks, e.g. multi-class `clustering`, keep their DCS but stay out, as diagnostics do);
C-DCS = mean of the T-DCS over the types that have one (VFLAIR's equal weights). Ours: the same
attacks and grouping with AP* = chance (0.5 for an AUC or a binary accuracy, 1/K for a K-class
accuracy), so a defense that brings an attack down to guessing scores as if it stopped it.

AP, per variant:
- `vflair` (default): VFLAIR's attack performance, as each attack's plug-in declares it and the
  analysis writes it into summary.json (`ap`). Score attacks: the accuracy of a threshold rule
  on the scores (the label-recovery rate VFLAIR's NormbasedScoring / DirectionbasedScoring keep;
  the AUC they also compute is discarded), mean over every batch where VFLAIR scores one stored
  batch. Label attacks and model completion: top-1 accuracy (pooled over rows). Feature
  reconstruction: 1 − MSE of the features scaled to [0, 1]. Backdoors: the attack success rate;
  noisy samples and missing features: the accuracy they cost. A summary written before `ap`
  existed: the threshold accuracy, else the headline, per metric.
- `auc`: splitleak's earlier DCS: score attacks by the mean flip-corrected leak AUC.
T-DCS groups the attacks by VFLAIR's families (label inference, feature reconstruction,
targeted backdoor, non-targeted), as each plug-in declares its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from orchestration.compare.entries import LeakEntry

BETA = 0.5


def _threshold_accuracy(entry: LeakEntry) -> float | None:
    return entry.threshold_accuracy


def _flipped_auc(entry: LeakEntry) -> float | None:
    return entry.flipped_mean


def _headline(entry: LeakEntry) -> float | None:
    """Label accuracy (pooled over rows), or a reconstruction's headline."""
    return entry.accuracy


def _recovered_counts(entry: LeakEntry) -> float | None:
    """A count attack's: 1 − its mean count error (VFLAIR's BLI), from a summary that predates
    the AP each plug-in declares."""
    return None if entry.batch_mean is None else 1.0 - entry.batch_mean


# variant -> metric of the entry -> its AP; metrics not named use the headline
ATTACK_PERFORMANCE: dict[str, dict[str, Callable[[LeakEntry], float | None]]] = {
    "vflair": {"auc": _threshold_accuracy, "count_error": _recovered_counts},
    "auc": {"auc": _flipped_auc, "count_error": _recovered_counts},
}
AP_WORDS = {
    "vflair": "VFLAIR's attack performance: score attacks by the accuracy of their threshold "
              "rule (mean over every batch; VFLAIR scores one stored batch), label attacks and "
              "model completion by top-1 accuracy pooled over rows, reconstruction by 1 − MSE on "
              "[0, 1]-scaled features (VFLAIR's FR)",
    "auc": "splitleak's AUC-based attack performance: score attacks by the mean flip-corrected "
           "leak AUC over batches, label attacks and model completion by top-1 accuracy pooled "
           "over rows, reconstruction by 1 − MSE on [0, 1]-scaled features",
}


def attack_performance(entry: LeakEntry | None, variant: str = "vflair") -> float | None:
    """The AP of one run's attack entry under `variant` (None when the entry lacks it)."""
    if entry is None:
        return None
    if variant == "vflair" and entry.ap is not None:
        return entry.ap
    return ATTACK_PERFORMANCE[variant].get(entry.metric, _headline)(entry)


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
