"""Norm attack (Li et al.): a larger cut-layer gradient norm means more likely positive."""

from __future__ import annotations

import numpy as np

from attacker.attacks._batch import as_rows, no_rows_excluded, squared_norms
from attacker.attacks.base import ATTACKS, Attack, AttackResult, SideKnowledge


@ATTACKS.register("norm")
class NormAttack(Attack):
    """Score = ‖g‖₂ at every width, a 1-wide gradient included (|g|; Li et al.'s reference code
    scores the signed g there: ALGORITHMS.md §2.1's Choice)."""

    name = "norm"
    family = "label_inference"
    vflair = "NS"
    side_knowledge = "none"

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        rows = as_rows(gradients)
        return AttackResult(np.sqrt(squared_norms(rows)), no_rows_excluded(rows.shape[0]))
