"""PELoss (Zheng et al., IJCAI'24; SecretFlow): same-class cut-layer outputs repel like charges.

The label party adds α · Σ_k L_pe(h_k) to its supervised loss. For passive party k's
activations h_1..h_B (flattened) and the batch's labels,

    L_pe(h) = (1/|P|) · Σ_{(i, j) ∈ P} 1 / sqrt(d(ĥ_i, ĥ_j)² + δ²),
    P = {(i, j): i ≠ j, y_i = y_j},

the mean potential energy of the same-class pairs, so minimising it pushes each class's outputs
apart (towards the decision boundary) and k-means on them, or on the gradients they cause,
finds no class clusters. ĥ = parameter-free layer normalisation of each row (`normalize`), so
the energy cannot be lowered by inflating the activations' scale; d = Euclidean distance, or
the angle arccos(cos(ĥ_i, ĥ_j)) (`distance = "angular"`); δ (`softening`) keeps coincident rows
(e.g. all-zero ReLU outputs) finite and differentiable. A batch with no same-class pair adds 0.

Choices where paper and code leave room: the mean over pairs (SecretFlow sums over each
class's pairs and divides by the class size, so its α ≈ ours / (n_c − 1) per class and grows
with the batch); layer normalisation in both distances (SecretFlow: angular only); the
softening δ instead of adding 1e-8 after the division. Pairwise sums run in row blocks
recomputed in backward (`pairwise.row_reduce`): peak memory O(BLOCK_ENTRIES + B·d).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import torch
from pydantic import Field, PositiveFloat
from torch.nn import functional as F

from label_party.objectives.base import OBJECTIVES, ObjectiveParams
from label_party.objectives.pairwise import flat_rows, row_reduce
from label_party.objectives.penalised import PartyPenalty
from splitleak.settings import MAX_SCALE

# Keeps arccos's derivative finite for (anti)parallel rows.
_COSINE_LIMIT = 1.0 - 1e-7


class PELossParams(ObjectiveParams):
    alpha: float = Field(ge=0.0, le=MAX_SCALE)  # weight of Σ_k L_pe(h_k) in the loss
    distance: Literal["euclidean", "angular"] = "euclidean"
    normalize: bool = True  # layer-normalise each row first (scale-free energy)
    softening: PositiveFloat = 1e-3  # δ in 1/sqrt(d² + δ²)


def _row_energy(block: torch.Tensor, rows: torch.Tensor, block_labels: torch.Tensor,
                block_index: torch.Tensor, labels: torch.Tensor, angular: bool,
                softening: float) -> torch.Tensor:
    """Per row i of the block: Σ_{j ≠ i, y_j = y_i} 1/sqrt(d_ij² + δ²)."""
    if angular:
        cosine = F.normalize(block, dim=1) @ F.normalize(rows, dim=1).T
        distance = torch.arccos(cosine.clamp(-_COSINE_LIMIT, _COSINE_LIMIT))
    else:
        distance = torch.cdist(block, rows, compute_mode="donot_use_mm_for_euclid_dist")
    pair = block_labels[:, None] == labels[None, :]
    pair[torch.arange(block.shape[0], device=pair.device), block_index] = False  # not itself
    energy = torch.rsqrt(distance.square() + softening**2)
    return torch.where(pair, energy, torch.zeros_like(energy)).sum(1)


def potential_energy(activation: torch.Tensor, labels: torch.Tensor, distance: str = "euclidean",
                     normalize: bool = True, softening: float = 1e-3) -> torch.Tensor:
    """L_pe of one party's [B, *shape] activations (0 when no two rows share a label)."""
    n = activation.shape[0]
    labels = labels.to(torch.int64)
    counts = torch.bincount(labels) if n else torch.zeros(0, dtype=torch.int64)
    n_pairs = int((counts * (counts - 1)).sum())
    if n_pairs == 0:
        return torch.zeros((), dtype=activation.dtype, device=activation.device)
    rows = flat_rows(activation)
    if normalize:
        rows = F.layer_norm(rows, rows.shape[1:])
    per_row = row_reduce(partial(_row_energy, labels=labels, angular=distance == "angular",
                                 softening=softening),
                         rows, labels, torch.arange(n, device=rows.device))
    return (per_row.sum() / n_pairs).to(activation.dtype)


@OBJECTIVES.register("pe_loss")
class PotentialEnergyLoss(PartyPenalty):
    """Cross-entropy plus α·Σ_k L_pe(h_k): each class's cut-layer outputs spread apart."""

    name = "pe_loss"
    Params = PELossParams
    params: PELossParams

    term_name = "pe_loss"

    @property
    def weight(self) -> float:
        return self.params.alpha

    def party_term(self, index: int, activation: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        p = self.params
        return potential_energy(activation, labels, p.distance, p.normalize, p.softening)

    def summary(self) -> dict[str, Any]:
        p = self.params
        return {"alpha": p.alpha, "distance": p.distance, "normalize": p.normalize,
                "softening": p.softening,
                "penalty": "alpha × Σ_k mean over same-class pairs of 1/sqrt(d² + δ²)",
                "seed": self.setup.seed}
