"""Direct label inference (Fu et al.): with softmax CE and no top model, dL/dz = p - y (a
binary run's one BCE logit: σ(z) - y)."""

from __future__ import annotations

import numpy as np

from attacker.attacks._batch import no_rows_excluded
from attacker.attacks.base import (
    ATTACKS,
    NO_PREDICTION,
    Attack,
    AttackResult,
    RunFacts,
    SideKnowledge,
)

NEEDS_LOGITS = ("needs the gradient of the logits (VFL without a top model, model.top = 'none'); "
                "this run's label party has a top model, so the gradient is not the loss's "
                "gradient in the logits")


@ATTACKS.register("direct_label")
class DirectLabelAttack(Attack):
    name = "direct_label"
    family = "label_inference"
    vflair = "DLI"
    kind = "label"
    cut_layer_only = True
    side_knowledge = ("none (no top model: the gradient is the softmax-CE p - y, or a binary run's "
                      "BCE σ - y)")

    def premise(self, facts: RunFacts, layer: str) -> str | None:
        return NEEDS_LOGITS if facts.top_model else None

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        rows = np.asarray(gradients)
        if rows.ndim != 2:
            raise ValueError(f"gradients must be [B, d], got shape {rows.shape}")
        negative = rows < 0
        if rows.shape[1] == 1:  # a binary run's one BCE logit: σ(z) - y < 0 exactly when y = 1
            inferred = np.where(negative[:, 0], 1, np.where(rows[:, 0] > 0, 0, NO_PREDICTION))
            return AttackResult(inferred.astype(np.int64), no_rows_excluded(rows.shape[0]))
        # The true class is the one coordinate with p_y - 1 < 0; a row with none (p_y rounded
        # to 1, or a perturbed gradient) gets no prediction, skipped and counted as Fu et al. do.
        inferred = np.where(negative.any(axis=1), negative.argmax(axis=1), NO_PREDICTION)
        inferred = inferred.astype(np.int64)
        return AttackResult(inferred, no_rows_excluded(rows.shape[0]))
