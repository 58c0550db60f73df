"""Batch label counts (VFLAIR's batch-level label inference): class counts from a summed gradient.

With no top model the gradient a party receives is the loss's gradient in the logits. For the
mean softmax cross-entropy over a batch of B rows, g_j = (p_j − e(y_j))/B, so the batch's sum
(e.g. the gradient of the party's last bias) is S = (Σ_j p_j − n)/B, n = the class counts.
The attacker sees only S and B, not the predictions, and takes them at their uniform prior
(Σ_j p_j ≈ B/K, exact at the start of training), so n̂ = B/K − B·S. Binary BCE (one logit,
d = 1): S = (Σ_j σ_j − n₁)/B and n̂₁ = B/2 − B·S. The estimate is clipped at 0 and rounded to
whole counts summing to B (largest remainders). The metric is the count error
Σ_c |n̂_c − n_c| / (2B): 0 = every count exact, 1 = disjoint; it is the share of the batch whose
labels the inferred counts misplace.

`reduction = "sum"` is for a label party that sums the loss over the batch (S = Σ_j p_j − n);
splitleak's label party takes the mean.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from attacker.attacks._batch import as_rows, no_rows_excluded, not_applicable
from attacker.attacks.base import (
    ATTACKS,
    Attack,
    AttackParams,
    AttackResult,
    RunFacts,
    SideKnowledge,
    label_without_defaults,
)
from attacker.attacks.direct_label import NEEDS_LOGITS


class BatchCountParams(AttackParams):
    reduction: Literal["mean", "sum"] = "mean"  # how the label party reduces its loss


def whole_counts(estimate: np.ndarray, total: int) -> np.ndarray:
    """Non-negative integers summing to `total`, proportional to max(estimate, 0) (largest
    remainders; ties to the lower class index); uniform if nothing is positive."""
    weights = np.maximum(np.asarray(estimate, dtype=np.float64), 0.0)
    if weights.sum() <= 0:
        weights = np.ones_like(weights)
    exact = weights * total / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    remainder = exact - counts
    order = np.argsort(-remainder, kind="stable")
    counts[order[: total - int(counts.sum())]] += 1
    return counts


@ATTACKS.register("batch_label_counts")
class BatchLabelCountsAttack(Attack):
    name = "batch_label_counts"
    family = "label_inference"
    vflair = "BLI"
    kind = "counts"
    cut_layer_only = True
    side_knowledge = ("none (no top model: the gradient is the loss's gradient in the logits; "
                      "only the batch's summed gradient and its size are used)")
    Params = BatchCountParams
    params: BatchCountParams

    @property
    def label(self) -> str:
        return label_without_defaults(self)

    def premise(self, facts: RunFacts, layer: str) -> str | None:
        return NEEDS_LOGITS if facts.top_model else None

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        rows = as_rows(gradients)
        n_rows, width = rows.shape
        classes = side.num_classes
        if width != classes and not (classes == 2 and width == 1):
            return not_applicable(n_rows, f"gradient width {width} is not the {classes} logits "
                                          "(needs VFL without a top model)")
        total = rows.sum(axis=0) * (n_rows if self.params.reduction == "mean" else 1)
        if width == 1:
            positives = n_rows / 2 - total[0]
            estimate = np.array([n_rows - positives, positives])
        else:
            estimate = n_rows / classes - total
        return AttackResult(whole_counts(estimate, n_rows).astype(np.float64),
                            no_rows_excluded(n_rows))
