"""The gradient-defense plug-in interface: g̃ = f(g, y, ctx), one instance per passive party."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from splitleak.config import ConfigError
from splitleak.provenance import PluginError, blamed
from splitleak.registry import Registry
from splitleak.settings import Settings


class DefenseError(PluginError):
    """A defense that raised, or returned other than a finite tensor of its input's shape and
    dtype; the message names the defense (its entry point and package where installed), the
    party and the step."""


class DefenseParams(Settings):
    """Base of every defense's parameter model (validated from the config's chain entry)."""


@dataclass
class DefenseContext:
    """What a defense may use for one batch of one passive party's cut gradient."""

    labels: torch.Tensor  # int64 [B]: the label party's true labels of the batch rows
    party_id: int
    epoch: int
    step: int
    num_classes: int
    generator: torch.Generator  # seeded from (run seed, chain position, party, step)
    diagnostics: dict[str, float] = field(default_factory=dict)  # per-batch numbers, name-prefixed
    # [K, B, *shape]: the cut gradient each row would give if its label were c (BCE: K = 2),
    # before any defense; computed only for a chain with a defense that declares it needs them.
    class_gradients: torch.Tensor | None = None


class Defense(ABC):
    """One gradient transform. Stateful defenses keep their state on the instance."""

    name: ClassVar[str]
    Params: ClassVar[type[DefenseParams]] = DefenseParams
    # True: the trainer computes ctx.class_gradients for the chain (K extra backward products).
    needs_class_gradients: ClassVar[bool] = False
    binary_only: ClassVar[bool] = False  # True: defined for two classes (validate refuses more)

    def __init__(self, params: DefenseParams) -> None:
        self.params = params

    @abstractmethod
    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        """Return the gradient to send: same shape and dtype as `cut_gradient` ([B, *shape])."""

    def summary(self) -> dict[str, Any]:
        """Run-level figures for the report (e.g. ε of a DP defense, pass-through counts)."""
        return {}

    @classmethod
    def joint_summary(cls, instances: list[Defense]) -> dict[str, Any]:
        """Run-level figures over every passive party's instance together (each party has its
        own), e.g. a privacy budget composed over all the rows one example's label reaches;
        {} for none. Every party's entry of the defense carries them."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a stateful defense carries from batch to batch (tensors, numbers, lists and
        dicts only), for checkpoints; a stateless one has nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` into an instance built from the same params."""
        return None


DEFENSES: Registry[type[Defense]] = Registry("defense", Defense)


def build_defense(name: str, params: dict[str, Any]) -> Defense:
    """The defense `name` built from `params` (as validation checks it: ConfigError naming one
    of one's own whose __init__ raised)."""
    cls = DEFENSES.get(name)
    return instantiate(cls, cls.Params.model_validate(params), ConfigError)


def instantiate(cls: type[Defense], params: DefenseParams,
                error: type[Exception] = DefenseError) -> Defense:
    """`cls(params)`; `error` naming a defense of one's own whose __init__ raised."""
    with blamed("defense", cls.name, cls, "__init__", error):
        return cls(params)
