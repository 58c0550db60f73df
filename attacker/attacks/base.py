"""The attack plug-in interface: per-batch scores (or labels) from received gradients."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from splitleak.registry import Registry

AttackKind = Literal["score", "label", "counts"]


class AttackParams(BaseModel):
    """Base of every attack's parameter model."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SideKnowledge:
    """The only way an attack learns anything about labels: what its threat model declares.

    Built per batch from the batch's true labels and a seeded generator; every index it
    hands out is marked as used, so the metric can exclude those rows from the AUC.
    """

    def __init__(self, labels: np.ndarray, rng: np.random.Generator,
                 num_classes: int | None = None) -> None:
        self._labels = labels
        self._rng = rng
        self.used = np.zeros(labels.shape[0], dtype=bool)
        # The task's class count is public (it fixes the model's output width), not a label.
        self.num_classes = num_classes or max(2, int(labels.max()) + 1 if labels.size else 2)

    def random_state(self) -> int:
        """A seed for the attack's own randomness (e.g. k-means' start), from the batch's stream."""
        return int(self._rng.integers(2**31 - 1))

    def known_positives(self, k: int) -> np.ndarray:
        """Indices of up to k positive (class 1) rows, chosen at random."""
        positives = np.flatnonzero(self._labels == 1)
        chosen = self._rng.choice(positives, size=min(k, positives.size), replace=False)
        self.used[chosen] = True
        return np.sort(chosen)

    def known_labels(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """m rows chosen at random, with their labels."""
        n_rows = self._labels.shape[0]
        chosen = np.sort(self._rng.choice(n_rows, size=min(m, n_rows), replace=False))
        self.used[chosen] = True
        return chosen, self._labels[chosen]

    def class_labels_oracle(self) -> np.ndarray:
        """Every row's label (oracle threat model, e.g. GAFM's mean/median evaluation).

        Rows are not marked as used: the oracle variant is an upper bound, as in GAFM.
        """
        return self._labels


@dataclass(frozen=True)
class AttackResult:
    """Scores (kind "score": larger = more likely positive), labels (kind "label") or the
    batch's class counts (kind "counts"); `skip_reason` says why the batch cannot be attacked."""

    values: np.ndarray  # float64 [B] scores, int64 [B] inferred labels, or float64 [K] counts
    exclude: np.ndarray  # bool [B]: rows given as side knowledge, left out of the metric
    skip_reason: str | None = None


class Attack(ABC):
    """One label-inference attack on a batch of received cut-layer gradients."""

    name: ClassVar[str]
    kind: ClassVar[AttackKind] = "score"
    side_knowledge: ClassVar[str]  # one line, printed next to every number
    Params: ClassVar[type[AttackParams]] = AttackParams
    cut_layer_only: ClassVar[bool] = False  # reads logit gradients: no first-layer analysis
    # Also run on the activations the party sent, when recorded (attacker.record_activation).
    on_activations: ClassVar[bool] = False

    def __init__(self, params: AttackParams) -> None:
        self.params = params

    def metric_kind(self, num_classes: int) -> AttackKind:
        """What the attack returns for a task with this many classes (its `kind` by default)."""
        return self.kind

    @property
    def per_epoch(self) -> bool:
        """True: attacked once per epoch, on all of the epoch's rows at once."""
        return False

    @abstractmethod
    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        """`gradients` is float32 [B, d] (multi-dimensional cut layers flattened)."""

    @property
    def label(self) -> str:
        """Name plus parameters, as shown in tables (e.g. `hint_distance(k=3)`)."""
        args = ", ".join(f"{k}={v}" for k, v in self.params.model_dump().items())
        return f"{self.name}({args})" if args else self.name


def label_without_defaults(attack: Attack) -> str:
    """Name plus only the parameters that differ from their defaults, e.g. `clustering(scope=epoch)`."""
    changed = attack.params.model_dump(exclude_defaults=True)
    args = ", ".join(f"{k}={v}" for k, v in changed.items())
    return f"{attack.name}({args})" if args else attack.name


ATTACKS: Registry[type[Attack]] = Registry("attack")


def build_attack(name: str, params: dict[str, Any]) -> Attack:
    cls = ATTACKS.get(name)
    return cls(cls.Params.model_validate(params))
