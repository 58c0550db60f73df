"""Training-based back-mapping (ALGORITHMS.md §2.11b, ResSFL / VFLAIR "TBM"): a decoder from
received activations to inputs, trained on the attacker's auxiliary rows, applied to the victims."""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from attacker.attacks.base import ATTACKS
from attacker.attacks.reconstruction.base import ReconstructionAttack, ReconstructionParams, Victim
from splitleak.seeding import derive_seed, rng
from splitleak.settings import MAX_BATCH, MAX_ITERATIONS, MAX_RATE, MAX_WIDTH


class BackMappingParams(ReconstructionParams):
    steps: int = Field(3000, ge=1, le=MAX_ITERATIONS, description="Adam steps of the decoder")
    batch_size: int = Field(64, ge=1, le=MAX_BATCH, description="auxiliary activation rows per step")
    lr: float = Field(1e-3, gt=0, le=MAX_RATE, description="Adam learning rate")
    hidden: int = Field(512, ge=1, le=MAX_WIDTH, description="width of the decoder's two hidden layers")


def decoder(width: int, numeric: int, cards: tuple[int, ...], hidden: int) -> nn.Sequential:
    """activation -> (numeric features, one logit block per categorical field)."""
    return nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, numeric + sum(cards)))


def back_map(victim: Victim, params: BackMappingParams, seed: int
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Train the decoder on (received activation, real features) of the auxiliary rows (every
    recorded epoch), then decode the victims' activations."""
    aux_n, aux_c = victim.truth(victim.aux_ids)
    shape = aux_n.shape[1:]
    flat = int(np.prod(shape))
    cards = victim.view.inputs.spec.cardinalities
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "back_mapping", "init", victim.party_id))
        net = decoder(victim.aux_received.shape[1], flat, cards, params.hidden)
    optimizer = torch.optim.Adam(net.parameters(), lr=params.lr)
    order = rng(seed, "back_mapping", "order", victim.party_id)
    inputs = torch.from_numpy(victim.aux_received)
    targets_n = aux_n.flatten(1)
    size = min(params.batch_size, inputs.shape[0])
    for _ in range(params.steps):
        rows = torch.from_numpy(order.choice(inputs.shape[0], size=size, replace=False))
        out = net(inputs[rows])
        loss = F.mse_loss(out[:, :flat], targets_n[rows]) if flat else out.sum() * 0
        start = flat
        for j, c in enumerate(cards):
            loss = loss + F.cross_entropy(out[:, start: start + c], aux_c[rows, j])
            start += c
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        out = net(torch.from_numpy(victim.received))
    numeric = out[:, :flat].reshape(-1, *shape)
    blocks = np.cumsum((flat, *cards))
    categorical = (torch.stack([out[:, a:b].argmax(1) for a, b in zip(blocks[:-1], blocks[1:],
                                                                        strict=True)], 1)
                   if cards else None)
    return numeric, categorical


@ATTACKS.register("back_mapping")
class BackMappingAttack(ReconstructionAttack):
    name = "back_mapping"
    family = "feature_reconstruction"
    vflair = "TBM"
    side_knowledge = ("the label party: the activations it received from the victim, and the real "
                      "features of its auxiliary rows (auxiliary_fraction of the train rows, not "
                      "scored)")
    Params = BackMappingParams
    params: BackMappingParams

    def reconstruct(self, victim: Victim, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return back_map(victim, self.params, seed)
