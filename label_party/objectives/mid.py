"""MID (VFLAIR; Zou et al.): a variational information bottleneck on each passive party's input.

Before the top model, the label party passes passive party k's activation h_k ([B, *shape],
flattened to d) through its own bottleneck: an encoder Linear(d, 2w) gives (μ, s), σ =
softplus(s − shift), z = μ + σ·ε with ε ~ N(0, I_w) drawn afresh each step from the run seed,
and a decoder Linear(w, hidden) → ReLU → Linear(hidden, d) gives back an activation of the
original shape for the top model. The loss adds

    λ · Σ_k mean_rows Σ_i KL(N(μ_i, σ_i²) ‖ N(0, 1)) = λ · Σ_k mean_rows Σ_i ½(μ_i² + σ_i² − 1) − ln σ_i,

and the gradient each party receives is its activation's gradient through the bottleneck
(then the defense chain). The bottlenecks train with the top model, under the label party's
optimizer (or `lr`).

Choices (VFLAIR's MID_model differs where noted): evaluation decodes the mean z = μ (VFLAIR
samples at test time too), so test metrics do not depend on the noise; the encoder has no ReLU
(VFLAIR's makes μ ≥ 0) and the decoder none on its output (a top = "none" run sums the decoded
outputs as logits); width w defaults to d (VFLAIR's bottleneck_scale = 1), hidden to 5w and
shift to 0.5 (VFLAIR's tabular value; 5 for images).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from pydantic import ConfigDict, Field
from torch import nn

from label_party.objectives.base import OBJECTIVES, ObjectiveParams, ObjectiveSetup, Own
from label_party.objectives.cross_entropy import load_top_state
from label_party.objectives.penalised import PartyPenalty
from splitleak.models import Bottleneck
from splitleak.optim import make_optimizer
from splitleak.seeding import derive_seed, generator
from splitleak.settings import MAX_RATE, MAX_SCALE, MAX_WIDTH


class MIDParams(ObjectiveParams):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    weight: float = Field(alias="lambda", ge=0.0, le=MAX_SCALE)  # λ (VFLAIR: 0, 1e-4, 1e-2, 1e-1, 1)
    width: int | None = Field(None, gt=0, le=MAX_WIDTH)  # w: bottleneck width; None = the activation width d
    hidden: int | None = Field(None, gt=0, le=MAX_WIDTH)  # decoder hidden width; None = 5w
    shift: float = 0.5  # σ = softplus(s − shift)
    lr: float | None = Field(None, gt=0.0, le=MAX_RATE)  # None: the label party's optimizer as configured


@OBJECTIVES.register("mid")
class MID(PartyPenalty):
    """Cross-entropy through one variational bottleneck per passive party, plus λ·KL."""

    name = "mid"
    term_name = "mid.kl"
    Params = MIDParams
    params: MIDParams

    def __init__(self, params: MIDParams, setup: ObjectiveSetup) -> None:
        super().__init__(params, setup)
        self.bottlenecks = nn.ModuleList()
        for k, shape in enumerate(setup.activation_shapes, start=1):
            dim = int(np.prod(shape))
            width = params.width or dim
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derive_seed(setup.seed, "mid", "bottleneck", k))
                self.bottlenecks.append(Bottleneck(dim, width, params.hidden or 5 * width,
                                                   params.shift))
        self.bottlenecks.to(setup.device)
        configured = setup.cfg.optimizer_for("label")
        optimizer = configured.model_copy(update={"lr": params.lr}) if params.lr else configured
        self.optimizer = make_optimizer([*self.top.parameters(), *self.bottlenecks.parameters()],
                                        optimizer)
        self.noise = generator(setup.seed, "mid", "noise")

    @property
    def _bottlenecks(self) -> Sequence[Bottleneck]:
        return cast("Sequence[Bottleneck]", self.bottlenecks)  # a ModuleList of Bottlenecks

    def logits(self, activations: list[torch.Tensor], own: Own, training: bool) -> torch.Tensor:
        self.bottlenecks.train(training)
        decoded = []
        for bottleneck, activation in zip(self._bottlenecks, activations, strict=True):
            noise = (torch.randn(activation.shape[0], bottleneck.width,
                                 generator=self.noise).to(activation.device)
                     if training else None)  # drawn on the CPU: the same noise on any device
            decoded.append(bottleneck(activation, noise))
        return super().logits(decoded, own, training)

    weight_field = "lambda"

    @property
    def weight(self) -> float:
        return self.params.weight

    def party_term(self, index: int, activation: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self._bottlenecks[index].kl(activation)

    def summary(self) -> dict[str, Any]:
        p = self.params
        widths = [b.width for b in self._bottlenecks]
        return {"lambda": p.weight, "width": widths, "hidden": [b.decoder[0].out_features
                                                                  for b in self._bottlenecks],
                "shift": p.shift, "lr": p.lr or self.setup.cfg.optimizer_for("label").lr,
                "evaluation": "decodes the mean z = μ", "seed": self.setup.seed}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "bottlenecks": self.bottlenecks.state_dict(),
                "noise": self.noise.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bottlenecks.load_state_dict(state["bottlenecks"])
        load_top_state(self, state)
        self.noise.set_state(state["noise"])
