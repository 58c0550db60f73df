"""The training-objective plug-in interface: what the label party learns from, and how."""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch.nn import functional as F

from splitleak.config import ExperimentConfig
from splitleak.inputs import PartyInputs
from splitleak.provenance import PluginError, plugin_origin
from splitleak.provenance import blamed as blamed_plugin
from splitleak.registry import Registry
from splitleak.settings import Settings


class ObjectiveParams(Settings):
    """Base of every objective's parameter model (validated from the config's `objective`)."""


@dataclass(frozen=True)
class ObjectiveSetup:
    """Everything an objective may use, fixed before training starts."""

    cfg: ExperimentConfig
    labels: np.ndarray  # int64 [num_rows]: the true labels (the label party's own)
    train_ids: np.ndarray  # int64: rows the objective may learn from
    num_classes: int
    activation_shapes: list[tuple[int, ...]]  # one per passive party, in party-id order
    own_inputs: PartyInputs | None  # the label party's own feature slice, if any
    seed: int
    device: torch.device = torch.device("cpu")  # where the models and the batches live

@dataclass
class StepResult:
    loss: float
    gradients: list[torch.Tensor]  # dL/dh per passive party, before the defense chain
    metrics: dict[str, Any] = field(default_factory=dict)
    # Per passive party [K, B, *shape]: dL/dh if every row's label were c (asked for by the chain).
    class_gradients: list[torch.Tensor] | None = None


Own = tuple[torch.Tensor | None, torch.Tensor | None]


def activation_gradients(activations: list[torch.Tensor]) -> list[torch.Tensor]:
    """dL/dh of each activation after the backward pass (each one takes part in the loss)."""
    gradients = [a.grad for a in activations]
    missing = [k for k, g in enumerate(gradients) if g is None]
    if missing:
        raise RuntimeError(f"activations {missing} took no part in the loss: no gradient")
    return [g for g in gradients if g is not None]


class Objective(ABC):
    """Owns the label party's trainable parts and turns activations into cut gradients."""

    name: ClassVar[str]
    Params: ClassVar[type[ObjectiveParams]] = ObjectiveParams
    # True: train_step(..., class_gradients=True) fills StepResult.class_gradients.
    supports_class_gradients: ClassVar[bool] = False
    # Set by the label party: cut_gradients may leave the backward pass to the objective's own
    # parameters to `update` (worth it where the label party has a core of its own to run it on
    # while the parties compute; it repeats the part of the pass between them and the loss).
    split_backward: bool = False

    def __init__(self, params: ObjectiveParams, setup: ObjectiveSetup) -> None:
        type(self).check(setup.cfg)  # the same check `splitleak validate` runs before start
        self.params = params
        self.setup = setup

    def train_step(self, activations: list[torch.Tensor], own: Own, sample_ids: np.ndarray,
                   labels: torch.Tensor, class_gradients: bool = False) -> StepResult:
        """One whole update: `cut_gradients`, then `update`."""
        result = self.cut_gradients(activations, own, sample_ids, labels, class_gradients)
        self.update()
        return result

    @abstractmethod
    def cut_gradients(self, activations: list[torch.Tensor], own: Own, sample_ids: np.ndarray,
                      labels: torch.Tensor, class_gradients: bool = False) -> StepResult:
        """One step's cut gradients. `activations` are leaf tensors that require grad;
        `labels` are the true labels of the batch (an objective may replace them, e.g. label
        DP). With `class_gradients` (only asked of objectives that support them), also the
        per-class gradients at the parameters before this step's update.

        The backward pass to the objective's own parameters and their update may be left to
        `update`: the label party runs it once the gradients are on their way, while the
        parties compute, and before anything else reads those parameters (LabelPartyTrainer
        sees to that)."""

    def update(self) -> None:
        """What `cut_gradients` left pending (the parameters' gradients, the optimizer's step);
        called once after each cut_gradients."""
        return None

    @abstractmethod
    def predict(self, activations: list[torch.Tensor], own: Own) -> torch.Tensor:
        """Logits for evaluation: [B, 1] (binary, BCE) or [B, K]."""

    def loss_weights(self) -> dict[str, float]:
        """The config fields that weigh a term of the loss ("objective.alpha") and their values:
        a step whose loss is not finite names them."""
        return {}

    @classmethod
    def check(cls, cfg: ExperimentConfig, num_classes: int | None = None) -> None:
        """Config requirements beyond the parameters (features, model, loss, the dataset's
        `num_classes` where known), checked before any process starts; raise
        `splitleak.config.ConfigError` naming the field."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint needs to continue exactly: models, optimizers, generators,
        running statistics (tensors, numbers, lists and dicts only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` into an instance built from the same params and setup."""
        return None

    def summary(self) -> dict[str, Any]:
        """Run-level figures for the report (e.g. ε of label DP)."""
        return {}


def supervised_loss(logits: torch.Tensor, targets: torch.Tensor, kind: str) -> torch.Tensor:
    """BCE-with-logits on one logit, or cross-entropy; `targets` may be soft ([B] or [B, K])."""
    if kind == "bce":
        return F.binary_cross_entropy_with_logits(logits[:, 0], targets.to(logits.dtype))
    if targets.dtype.is_floating_point:
        return torch.sum(-targets * F.log_softmax(logits, dim=1), dim=1).mean()
    return F.cross_entropy(logits, targets)


def per_class_gradients(logits: torch.Tensor, activations: list[torch.Tensor],
                        class_targets: torch.Tensor, kind: str) -> list[torch.Tensor]:
    """Per party [K, B, *shape]: the gradient of `supervised_loss(logits, class_targets[c])`
    with respect to each activation, for every c at once.

    The loss's derivative in the logits is vmapped over the K target sets; the K products with
    the Jacobian of the model then go through one batched backward pass (no loop over rows or
    classes). `logits` must still hold its graph; it is kept for the caller's own backward.
    """
    def loss_at(z: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return supervised_loss(z, targets, kind)

    cotangents = torch.func.vmap(torch.func.grad(loss_at), in_dims=(None, 0))(
        logits.detach(), class_targets)
    return list(torch.autograd.grad(logits, activations, grad_outputs=cotangents,
                                    retain_graph=True, is_grads_batched=True))


OBJECTIVES: Registry[type[Objective]] = Registry("objective", Objective)


class ObjectiveError(PluginError):
    """An objective plug-in that raised, or answered outside the interface above (a StepResult
    with one gradient per party, each of its activation's shape and dtype; logits [B, width]).
    The message names the objective, and its entry point and package where installed."""


def origin(objective: type[Objective]) -> str:
    return plugin_origin("objective", _name(objective), objective)


def _name(objective: type[Objective]) -> str:
    return getattr(objective, "name", objective.__qualname__)


def blamed(objective: type[Objective], method: str,
           error: type[Exception] = ObjectiveError) -> AbstractContextManager[None]:
    """An exception out of an installed objective's `method` as an ObjectiveError (or `error`)
    naming it and the line it raised at (a built-in's, and a ConfigError from its checks, pass
    unchanged)."""
    return blamed_plugin("objective", _name(objective), objective, method, error)


def check_step_result(objective: type[Objective], result: Any,
                      activations: list[torch.Tensor]) -> None:
    """ObjectiveError where `cut_gradients` returned something the label party cannot send."""
    problem = None
    if not isinstance(result, StepResult):
        problem = f"a {type(result).__name__}; it must return a StepResult"
    elif not isinstance(result.loss, numbers.Real) or isinstance(result.loss, bool):
        problem = (f"a StepResult whose loss is a {type(result.loss).__name__}; it must be a "
                   "float (e.g. float(loss.detach()))")
    elif not isinstance(result.gradients, list | tuple) or \
            len(result.gradients) != len(activations):
        count = len(result.gradients) if isinstance(result.gradients, list | tuple) else "no list of"
        problem = (f"{count} gradient(s) for {len(activations)} passive parties; it must return "
                   "one per party, in the order of the activations")
    else:
        for k, (g, a) in enumerate(zip(result.gradients, activations, strict=True)):
            if not isinstance(g, torch.Tensor) or g.shape != a.shape or g.dtype != a.dtype:
                found = (f"{g.dtype} {list(g.shape)}" if isinstance(g, torch.Tensor)
                         else f"a {type(g).__name__}")
                problem = (f"gradient {k} as {found}; each must be a tensor of its activation's "
                           f"shape and dtype ({a.dtype} {list(a.shape)})")
                break
        else:
            per_class = result.class_gradients
            if per_class is not None and (not isinstance(per_class, list | tuple)
                                          or len(per_class) != len(activations)):
                count = len(per_class) if isinstance(per_class, list | tuple) else "no list of"
                problem = (f"{count} class gradient(s) for {len(activations)} passive parties; "
                           "class_gradients is None or one per party, in the order of the "
                           "activations")
    if problem:
        raise ObjectiveError(f"{origin(objective)}: cut_gradients() returned {problem}")


def check_logits(objective: type[Objective], logits: Any, rows: int, width: int) -> None:
    """ObjectiveError where `predict` returned something other than logits [rows, width]."""
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (rows, width):
        found = (f"{logits.dtype} {list(logits.shape)}" if isinstance(logits, torch.Tensor)
                 else f"a {type(logits).__name__}")
        raise ObjectiveError(f"{origin(objective)}: predict() returned {found}; it must return "
                             f"logits [{rows}, {width}] (one per class, or one for BCE)")


def build_objective(name: str, params: dict[str, Any], setup: ObjectiveSetup) -> Objective:
    cls = OBJECTIVES.get(name)
    params_ = cls.Params.model_validate(params)
    with blamed(cls, "__init__"):
        return cls(params_, setup)
