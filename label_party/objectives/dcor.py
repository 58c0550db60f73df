"""dCor (NoPeek's distance correlation; SecretFlow's label-side baseline): α·dCor(y, h_k) in the loss.

The label party adds α · Σ_k dCor(y, h_k) to its supervised loss, h_k = passive party k's
activation over the batch (flattened), y the labels: the cut layer is trained to carry less
label information, and the gradients sent back carry the penalty's share. dCor is Székely's
sample distance correlation of the batch (V-statistic): with a_ij = ‖h_i − h_j‖ and
b_ij = ‖e(y_i) − e(y_j)‖ (one-hot e; b_ij = √2·[y_i ≠ y_j], and dCor does not see the √2),
A, B their double-centred matrices, dCov² = mean(A∘B), dVar² likewise, and
dCor = sqrt(dCov²(h, y) / sqrt(dVar²(h)·dVar²(y))) — 0 when either variance is 0 (a one-class
batch, a batch of one row, constant activations). `squared = true` penalises dCor² instead, as
SecretFlow's DcorLoss does.

Memory (project choice): A is never stored. mean(A∘B) = (Σ a_ij b_ij − (2/n)·Σ_i r_i q_i +
(Σ r)(Σ q)/n²)/n² with r, q the row sums of a and b, so only per-row sums are kept, computed
in row blocks that are recomputed in backward (`pairwise.row_reduce`): peak memory
O(BLOCK_ENTRIES + B·d), not O(B²); the work stays O(B²·d). Computed in float64.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from pydantic import Field

from label_party.objectives.base import OBJECTIVES, ObjectiveParams
from label_party.objectives.pairwise import flat_rows, row_reduce
from label_party.objectives.penalised import PartyPenalty
from splitleak.settings import MAX_SCALE


class DcorParams(ObjectiveParams):
    alpha: float = Field(ge=0.0, le=MAX_SCALE)  # weight of Σ_k dCor(y, h_k) in the loss
    squared: bool = False  # penalise dCor² (SecretFlow's DcorLoss) instead of dCor (NoPeek)


def _row_sums(block: torch.Tensor, rows: torch.Tensor, block_labels: torch.Tensor,
              labels: torch.Tensor) -> torch.Tensor:
    """Per row of the block: Σ_j a_ij·[y_i ≠ y_j], Σ_j a_ij², Σ_j a_ij."""
    a = torch.cdist(block, rows, compute_mode="donot_use_mm_for_euclid_dist")
    differ = (block_labels[:, None] != labels[None, :]).to(a.dtype)
    return torch.stack([(a * differ).sum(1), a.square().sum(1), a.sum(1)], dim=1)


def distance_correlation(activation: torch.Tensor, labels: torch.Tensor,
                         squared: bool = False) -> torch.Tensor:
    """dCor (or dCor²) between the labels and the rows of `activation` ([B, *shape])."""
    n = activation.shape[0]
    zero = torch.zeros((), dtype=activation.dtype, device=activation.device)
    if n < 2:
        return zero
    rows = flat_rows(activation)
    labels = labels.to(torch.int64)
    q = (n - torch.bincount(labels)[labels]).to(torch.float64)  # row sums of [y_i ≠ y_j]
    sums = row_reduce(partial(_row_sums, labels=labels), rows, labels)
    r = sums[:, 2]
    n2 = float(n * n)

    def centred(cross: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (cross - 2.0 / n * (u @ v) + u.sum() * v.sum() / n2) / n2

    covariance = centred(sums[:, 0].sum(), r, q)
    variance_h = centred(sums[:, 1].sum(), r, r)
    variance_y = centred(q.sum(), q, q)  # b_ij ∈ {0, 1}: Σ b_ij² = Σ b_ij
    if float(variance_h.detach()) <= 0.0 or float(variance_y) <= 0.0:
        return zero
    dcor2 = (covariance / torch.sqrt(variance_h * variance_y)).clamp_min(0.0)
    # The clamp keeps sqrt's derivative finite when the two are (nearly) independent.
    value = dcor2 if squared else torch.sqrt(dcor2.clamp_min(1e-18))
    return value.to(activation.dtype)


@OBJECTIVES.register("dcor")
class DistanceCorrelation(PartyPenalty):
    """Cross-entropy plus α·Σ_k dCor(y, h_k) over the passive parties' activations."""

    name = "dcor"
    Params = DcorParams
    params: DcorParams

    term_name = "dcor"

    @property
    def weight(self) -> float:
        return self.params.alpha

    def party_term(self, index: int, activation: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return distance_correlation(activation, labels, self.params.squared)

    def summary(self) -> dict[str, Any]:
        return {"alpha": self.params.alpha,
                "statistic": "dCor²" if self.params.squared else "dCor",
                "penalty": "alpha × Σ_k dCor(one-hot y, h_k) per batch, added to the loss",
                "seed": self.setup.seed}
