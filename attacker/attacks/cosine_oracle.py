"""Cosine attack with an oracle (Li et al. §3.3): similarity to one known positive's clean gradient."""

from __future__ import annotations

import numpy as np

from attacker.attacks._batch import as_rows, not_applicable, one_sign, unit_rows, unscored
from attacker.attacks.base import ATTACKS, Attack, AttackResult, RunFacts, SideKnowledge
from attacker.attacks.thresholds import POSITIVE_SCORE


@ATTACKS.register("cosine_oracle")
class CosineOracleAttack(Attack):
    name = "cosine_oracle"
    family = "label_inference"
    vflair = "DS"
    side_knowledge = ("the clean (pre-defense) gradient of one random positive per batch, drawn "
                      "by the label party (excluded from the metric); under a defense only at a "
                      "single party's cut layer, where the label party writes the clean rows")
    needs_clean_anchors = True
    threshold = POSITIVE_SCORE

    def premise(self, facts: RunFacts, layer: str) -> str | None:
        """Li et al.'s oracle knows a *clean* positive gradient. Without a defense the received
        row is that gradient, at every layer; under one, only the label party's artifact has it,
        and only for a single party's cut layer (it never sees the passive bottom models)."""
        if not facts.perturbed or (layer == "cut" and not facts.colluding):
            return None
        where = "a colluding group's gradients" if facts.colluding else f"the {layer} layer"
        return (f"no clean anchor for {where}: the label party writes clean positive gradients for "
                "single parties' cut layers only, and under a defense the received row is a "
                "noised anchor")

    @property
    def randomised(self) -> bool:
        return True

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        rows = as_rows(gradients)
        reason = one_sign(rows)
        if reason is not None:
            return not_applicable(rows.shape[0], reason)
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
