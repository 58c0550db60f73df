"""Plain supervised training: the top model on the aggregated activations, BCE or CE."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from label_party.objectives.base import (
    OBJECTIVES,
    Objective,
    ObjectiveParams,
    ObjectiveSetup,
    Own,
    StepResult,
    supervised_loss,
)
from splitleak.models import build_top
from splitleak.optim import make_optimizer
from splitleak.seeding import derive_seed


@OBJECTIVES.register("cross_entropy")
class CrossEntropy(Objective):
    """The default: no label protection; subclasses change the targets (label DP, KD^k)."""

    name = "cross_entropy"

    def __init__(self, params: ObjectiveParams, setup: ObjectiveSetup) -> None:
        super().__init__(params, setup)
        cfg = setup.cfg
        self.loss_kind = cfg.loss_for(setup.num_classes)
        self.top = build_top(cfg.model, setup.activation_shapes,
                             setup.own_inputs.spec if setup.own_inputs else None,
                             cfg.output_width(setup.num_classes), derive_seed(setup.seed, "top"))
        # top = "none" with no own features leaves the label party nothing to train.
        params = list(self.top.parameters())
        self.optimizer = make_optimizer(params, cfg.optimizer_for("label")) if params else None

    def targets(self, sample_ids: np.ndarray, labels: torch.Tensor) -> torch.Tensor:
        """What the loss is computed against (the true labels here)."""
        return labels

    def train_step(self, activations: list[torch.Tensor], own: Own, sample_ids: np.ndarray,
                   labels: torch.Tensor) -> StepResult:
        self.top.train()
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        loss = supervised_loss(self.top(activations, *own), self.targets(sample_ids, labels),
                               self.loss_kind)
        loss.backward()
        if self.optimizer is not None:
            self.optimizer.step()
        return StepResult(float(loss.detach()), [a.grad for a in activations])

    def predict(self, activations: list[torch.Tensor], own: Own) -> torch.Tensor:
        self.top.eval()
        return self.top(activations, *own)

    def state_dict(self) -> dict[str, Any]:
        optimizer = self.optimizer.state_dict() if self.optimizer is not None else None
        return {"top": self.top.state_dict(), "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.top.load_state_dict(state["top"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
