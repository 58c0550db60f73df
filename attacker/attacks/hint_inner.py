"""Hint inner-product attack (Li et al. code): projection on the largest-norm known positive."""

from __future__ import annotations

import numpy as np

from attacker.attacks._batch import as_rows, squared_norms, unscored
from attacker.attacks.base import ATTACKS, Attack, AttackResult, SideKnowledge
from attacker.attacks.hint_distance import HintParams
from attacker.attacks.thresholds import POSITIVE_SCORE


@ATTACKS.register("hint_inner")
class HintInnerAttack(Attack):
    name = "hint_inner"
    family = "label_inference"
    side_knowledge = "k random positives per batch (excluded from the metric)"
    Params = HintParams
    params: HintParams
    threshold = POSITIVE_SCORE  # the hint is a positive: a positive projection is its side

    @property
    def randomised(self) -> bool:
        return True

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        rows = as_rows(gradients)
        hints = side.known_positives(self.params.k)
        if hints.size == 0:
            return unscored(rows.shape[0])
        exclude = np.zeros(rows.shape[0], dtype=bool)
        exclude[hints] = True
        largest = rows[hints[np.argmax(squared_norms(rows[hints]))]]
        return AttackResult(rows @ largest, exclude)
