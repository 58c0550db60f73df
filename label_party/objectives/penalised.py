"""Cross-entropy plus a weighted per-party penalty on the activations (dCor, PELoss, MID's KL)."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import torch

from label_party.objectives.cross_entropy import CrossEntropy, load_top_state


class PartyPenalty(CrossEntropy):
    """loss = supervised loss + weight · Σ_k term(k, h_k), one term per passive party."""

    term_name: ClassVar[str]  # metric prefix: "<term_name>.party_<k>" per batch
    weight_field: ClassVar[str] = "alpha"  # the objective's parameter that holds `weight`

    @property
    @abstractmethod
    def weight(self) -> float:
        """The penalty's weight in the loss (α, λ)."""

    @abstractmethod
    def party_term(self, index: int, activation: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The unweighted scalar term of the `index`-th passive party (0-based)."""

    def loss_weights(self) -> dict[str, float]:
        fields = type(self.params).model_fields  # a subclass may name its weight otherwise
        named = set(fields) | {field.alias for field in fields.values() if field.alias}
        return {f"objective.{self.weight_field}": self.weight} if self.weight_field in named else {}

    def penalty(self, activations: list[torch.Tensor],
                labels: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, Any]]:
        values = [self.party_term(i, a, labels) for i, a in enumerate(activations)]
        # Activations arrive in party-id order; the passive parties are numbered 1..N.
        metrics = {f"{self.term_name}.party_{k}": float(v.detach())
                   for k, v in enumerate(values, start=1)}
        return self.weight * torch.stack(values).sum(), metrics

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_top_state(self, state)
