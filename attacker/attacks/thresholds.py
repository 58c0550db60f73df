"""Threshold rules: how a score attack's scores become hard labels, for VFLAIR's attack
performance (the label-recovery accuracy its scoring scripts keep, ALGORITHMS.md §1)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# VFLAIR's NormbasedScoring adds this to both sides of its min-max normalisation.
_EPSILON = 1e-16


@dataclass(frozen=True)
class ThresholdRule:
    """`decide` maps the scored rows' scores to 0/1 labels; `flip`: the accuracy kept is
    max(acc, 1 − acc), as VFLAIR's data_process.py does for the norm attack."""

    words: str  # printed next to the accuracy
    decide: Callable[[np.ndarray], np.ndarray]
    flip: bool

    def accuracy(self, scores: np.ndarray, labels: np.ndarray,
                 decisions: np.ndarray | None = None) -> float:
        """Share of rows labelled right (an attack's own `decisions` replace the rule's)."""
        predicted = self.decide(scores) if decisions is None else decisions
        accuracy = float(np.mean(np.asarray(predicted, dtype=np.int64) == labels))
        return max(accuracy, 1.0 - accuracy) if self.flip else accuracy


def _above_half_of_range(scores: np.ndarray) -> np.ndarray:
    low, high = float(scores.min()), float(scores.max())
    return ((scores - low + _EPSILON) / (high - low + _EPSILON) > 0.5).astype(np.int64)


def _positive(scores: np.ndarray) -> np.ndarray:
    return (scores > 0).astype(np.int64)


def _not_negative(scores: np.ndarray) -> np.ndarray:
    return (scores >= 0).astype(np.int64)


# VFLAIR's NormbasedScoring; the rule of every score attack without a threshold of its own.
MIN_MAX_HALF = ThresholdRule("positive where the min-max normalised score is > 0.5, then "
                             "max(acc, 1 − acc) (VFLAIR's NormbasedScoring)", _above_half_of_range,
                             flip=True)
# VFLAIR's DirectionbasedScoring: cosine with the positive anchor above 0; not flipped.
POSITIVE_SCORE = ThresholdRule("positive where the score is > 0 (VFLAIR's "
                               "DirectionbasedScoring)", _positive, flip=False)
# GAFM's hard rule for the center attacks: positive iff nearer the positive center.
NEARER_POSITIVE_CENTER = ThresholdRule("positive where nearer the positive center, score ≥ 0 "
                                       "(GAFM's hard rule)", _not_negative, flip=False)
