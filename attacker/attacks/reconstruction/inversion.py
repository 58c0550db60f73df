"""White-box inversion (ALGORITHMS.md §2.11a): the input whose activation under the victim's
bottom model is nearest to the received one, with a total-variation prior on images."""

from __future__ import annotations

import torch
from pydantic import Field

from attacker.attacks.base import ATTACKS
from attacker.attacks.reconstruction.base import (
    ReconstructionAttack,
    ReconstructionParams,
    Victim,
    soft_forward,
)
from splitleak.settings import MAX_ITERATIONS, MAX_RATE


class InversionParams(ReconstructionParams):
    steps: int = Field(400, ge=1, le=MAX_ITERATIONS,
                       description="Adam steps from the fixed start (every row at 0, the train "
                       "mean of the standardised features)")
    lr: float = Field(0.05, gt=0, le=MAX_RATE, description="Adam learning rate")
    tv: float = Field(0.05, ge=0, description="λ of the total-variation prior (images)")


def total_variation(images: torch.Tensor) -> torch.Tensor:
    """Per image: mean |difference| of vertically and horizontally adjacent pixels (anisotropic)."""
    down = (images[..., 1:, :] - images[..., :-1, :]).abs().flatten(1).mean(1)
    right = (images[..., :, 1:] - images[..., :, :-1]).abs().flatten(1).mean(1)
    return down + right


def invert(victim: Victim, params: InversionParams) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Minimise mean‖f_k(x̂) − h‖² + λ·TV(x̂) per row by Adam; rows are independent (the loss is
    their sum and Adam is per coordinate), so every row is solved at once."""
    bottom = victim.view.bottom.eval()
    for parameter in bottom.parameters():
        parameter.requires_grad_(False)
    received = torch.from_numpy(victim.received)
    truth_n, truth_c = victim.truth(victim.ids[:1])
    numeric = torch.zeros((victim.ids.size, *truth_n.shape[1:]), requires_grad=True)
    cards = victim.view.inputs.spec.cardinalities
    logits = [torch.zeros(victim.ids.size, c, requires_grad=True) for c in cards]
    optimizer = torch.optim.Adam([numeric, *logits], lr=params.lr)
    image = victim.image_shape is not None
    for _ in range(params.steps):
        out = soft_forward(bottom, numeric, logits).flatten(1)
        loss = ((out - received) ** 2).mean(1)
        if image and params.tv:
            loss = loss + params.tv * total_variation(numeric)
        optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()
        optimizer.step()
    categorical = torch.stack([z.argmax(1) for z in logits], 1) if logits else None
    return numeric.detach(), categorical


@ATTACKS.register("inversion")
class InversionAttack(ReconstructionAttack):
    name = "inversion"
    family = "feature_reconstruction"
    side_knowledge = ("the label party: the activations it received from the victim and the "
                      "victim's trained bottom model (white box)")
    Params = InversionParams
    params: InversionParams

    def reconstruct(self, victim: Victim, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return invert(victim, self.params)
