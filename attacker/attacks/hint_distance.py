"""Hint-distance attack (Li et al. code): closeness to the nearest of k known positives."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from attacker.attacks._batch import as_rows, distances, unscored
from attacker.attacks.base import ATTACKS, Attack, AttackParams, AttackResult, SideKnowledge
from splitleak.settings import MAX_BATCH


class HintParams(AttackParams):
    k: int = Field(1, ge=1, le=MAX_BATCH, description="known positives (hints) per batch")


@ATTACKS.register("hint_distance")
class HintDistanceAttack(Attack):
    name = "hint_distance"
    family = "label_inference"
    side_knowledge = "k random positives per batch (excluded from the metric)"
    Params = HintParams
    params: HintParams

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
        return AttackResult(-distances(rows, rows[hints]).min(axis=1), exclude)
