"""Cosine attack with an oracle (Li et al.): similarity to one known positive's gradient."""

from __future__ import annotations

import numpy as np

from attacker.attacks._batch import as_rows, unit_rows, unscored
from attacker.attacks.base import ATTACKS, Attack, AttackResult, SideKnowledge


@ATTACKS.register("cosine_oracle")
class CosineOracleAttack(Attack):
    name = "cosine_oracle"
    side_knowledge = "one random positive per batch (excluded from the metric)"

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        rows = as_rows(gradients)
        picked = side.known_positives(1)
        if picked.size == 0:
            return unscored(rows.shape[0])
        units = unit_rows(rows)
        exclude = np.zeros(rows.shape[0], dtype=bool)
        exclude[picked] = True
        return AttackResult(units @ units[picked[0]], exclude)
