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
    activation_gradients,
    per_class_gradients,
    supervised_loss,
)
from splitleak.models import build_top
from splitleak.optim import make_optimizer
from splitleak.placement import autocast
from splitleak.seeding import derive_seed


@OBJECTIVES.register("cross_entropy")
class CrossEntropy(Objective):
    """The default: no label protection. Subclasses change the targets (label DP, KD^k, CAE),
    the path from activations to logits (MID) or add a penalty to the loss (dCor, PELoss)."""

    name = "cross_entropy"
    supports_class_gradients = True

    def __init__(self, params: ObjectiveParams, setup: ObjectiveSetup) -> None:
        super().__init__(params, setup)
        cfg = setup.cfg
        self.loss_kind = cfg.loss_for(setup.num_classes)
        self.top = build_top(cfg.model, setup.activation_shapes,
                             setup.own_inputs.spec if setup.own_inputs else None,
                             cfg.output_width(setup.num_classes),
                             derive_seed(setup.seed, "top")).to(setup.device)
        self.autocast = autocast(cfg.training.precision, setup.device)
        # top = "none" with no own features leaves the label party nothing to train.
        trainable = list(self.top.parameters())
        self.optimizer = make_optimizer(trainable, cfg.optimizer_for("label")) if trainable else None
        self._loss: torch.Tensor | None = None  # split backward: the loss, its graph kept

    def rows(self, sample_ids: np.ndarray) -> torch.Tensor:
        """These sample ids as an index on the label party's device."""
        return torch.from_numpy(np.asarray(sample_ids, dtype=np.int64)).to(self.setup.device)

    def targets(self, sample_ids: np.ndarray, labels: torch.Tensor) -> torch.Tensor:
        """What the loss is computed against (the true labels here)."""
        return labels

    def class_targets(self, batch_size: int) -> torch.Tensor:
        """[K, B] (or [K, B, K] soft) targets: every row labelled c, for each class c.

        BCE has one logit and the two "classes" 0 and 1."""
        device = self.setup.device
        if self.loss_kind == "bce":
            return torch.arange(2, dtype=torch.float32, device=device)[:, None].expand(2, batch_size)
        classes = self.setup.num_classes
        return torch.arange(classes, device=device)[:, None].expand(classes, batch_size)

    def logits(self, activations: list[torch.Tensor], own: Own, training: bool) -> torch.Tensor:
        """The model from the parties' activations to the logits (float32, also under bf16)."""
        self.top.train(training)
        with self.autocast():
            return self.top(activations, *own).float()

    def penalty(self, activations: list[torch.Tensor],
                labels: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """A term added to the supervised loss, and its per-step metrics (none here)."""
        return None, {}

    def cut_gradients(self, activations: list[torch.Tensor], own: Own, sample_ids: np.ndarray,
                      labels: torch.Tensor, class_gradients: bool = False) -> StepResult:
        """With `split_backward`, the backward pass to the activations only: the parameters'
        gradients (the wide part's embeddings too, which no activation depends on) are left to
        `update`. The same operations as one backward pass, so the same numbers."""
        logits = self.logits(activations, own, training=True)
        loss = supervised_loss(logits, self.targets(sample_ids, labels), self.loss_kind)
        penalty, metrics = self.penalty(activations, labels)
        if penalty is not None:
            metrics = {f"{self.name}.supervised_loss": float(loss.detach()), **metrics}
            loss = loss + penalty
        per_class = (per_class_gradients(logits, activations, self.class_targets(len(labels)),
                                         self.loss_kind) if class_gradients else None)
        if self.split_backward and self.optimizer is not None:
            gradients = list(torch.autograd.grad(loss, activations, retain_graph=True))
            self._loss = loss
        else:
            if self.optimizer is not None:
                self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            gradients = activation_gradients(activations)
        return StepResult(float(loss.detach()), gradients, metrics, per_class)

    def update(self) -> None:
        """The parameters' gradients of the last step's loss if `cut_gradients` left them,
        then the optimizer's step (once per cut_gradients)."""
        if self.optimizer is None:
            return
        if self._loss is not None:
            loss, self._loss = self._loss, None
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward(inputs=[p for group in self.optimizer.param_groups
                                  for p in group["params"] if p.requires_grad])
        self.optimizer.step()

    def predict(self, activations: list[torch.Tensor], own: Own) -> torch.Tensor:
        return self.logits(activations, own, training=False)

    def state_dict(self) -> dict[str, Any]:
        optimizer = self.optimizer.state_dict() if self.optimizer is not None else None
        return {"top": self.top.state_dict(), "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_top_state(self, state)


def load_top_state(objective: CrossEntropy, state: dict[str, Any]) -> None:
    """Restore what CrossEntropy.state_dict saved: the top model and its optimizer."""
    objective._loss = None  # a pending update belongs to the state replaced
    objective.top.load_state_dict(state["top"])
    if objective.optimizer is not None:
        objective.optimizer.load_state_dict(state["optimizer"])
