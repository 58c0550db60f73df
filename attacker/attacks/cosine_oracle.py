"""Cosine attack with an oracle (Li et al. §3.3): similarity to one known positive's clean gradient."""

from __future__ import annotations

import numpy as np

from attacker.attacks._batch import as_rows, unit_rows, unscored
from attacker.attacks.base import ATTACKS, Attack, AttackResult, SideKnowledge


@ATTACKS.register("cosine_oracle")
class CosineOracleAttack(Attack):
    name = "cosine_oracle"
    family = "label_inference"
    vflair = "DS"
    side_knowledge = ("the clean (pre-defense) cut-layer gradient of one random positive per batch, "
                      "drawn by the label party (excluded from the metric; first layer: the "
                      "received row)")
    needs_clean_anchors = True

    @property
    def randomised(self) -> bool:
        return True

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        rows = as_rows(gradients)
        picked = side.clean_positive()
        if picked is None:
            return unscored(rows.shape[0])
        row, clean = picked
        anchor = rows[row] if clean is None else np.asarray(clean, dtype=np.float64).reshape(-1)
        if anchor.shape != rows.shape[1:]:
            raise ValueError(f"clean anchor has {anchor.size} values but the gradients have "
                             f"{rows.shape[1]}")
        exclude = np.zeros(rows.shape[0], dtype=bool)
        exclude[row] = True
        return AttackResult(unit_rows(rows) @ unit_rows(anchor[None])[0], exclude)
