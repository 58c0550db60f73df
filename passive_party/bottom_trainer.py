"""A passive party's math: bottom model forward on its own rows, backward from the cut gradient."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from passive_party.malicious_optimizer import MaliciousSGD
from splitleak.config import ExperimentConfig
from splitleak.fileio import write_atomically
from splitleak.inputs import PartyInputs
from splitleak.models import build_bottom
from splitleak.optim import make_optimizer
from splitleak.placement import autocast, settle
from splitleak.seeding import derive_seed


def bottom_optimizer(cfg: ExperimentConfig, party_id: int,
                     params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The configured optimizer, or Fu et al.'s malicious SGD when the threat model says so
    (opt-in per party; it takes lr, momentum and weight decay from the party's sgd settings)."""
    threat = cfg.threat.party(party_id)
    settings = cfg.optimizer_for(str(party_id))
    if threat is None or threat.optimizer != "malicious":
        return make_optimizer(params, settings)
    return MaliciousSGD(params, lr=settings.lr, momentum=settings.momentum,
                        weight_decay=settings.weight_decay, gamma=threat.gamma, clamp=threat.clamp)


class BottomTrainer:
    """Holds only this party's columns; never sees a label. Its rows, model and optimizer live
    on `device`; activations and gradients come and go as tensors of any device."""

    def __init__(self, cfg: ExperimentConfig, party_id: int, inputs: PartyInputs,
                 output_width: int, capture_first_layer: bool = False,
                 device: torch.device | str = "cpu") -> None:
        self.party_id = party_id
        self.device = torch.device(device)
        self.inputs = inputs.to(self.device)
        self.model = build_bottom(cfg.model, inputs.spec, output_width,
                                  derive_seed(cfg.run.seed, "bottom", party_id)).to(self.device)
        self.autocast = autocast(cfg.training.precision, self.device)
        self.optimizer = bottom_optimizer(cfg, party_id, self.model.parameters())
        self._activation: torch.Tensor | None = None
        self._first_output: torch.Tensor | None = None
        self.first_layer_gradient: torch.Tensor | None = None  # after each backward, if captured
        if capture_first_layer:
            first = next(m for m in self.model.modules() if isinstance(m, nn.Linear | nn.Conv2d))
            first.register_forward_hook(self._keep_first_output)
        with torch.no_grad():  # eval: batch norm's running statistics stay untouched
            numeric, categorical = self.inputs.rows(torch.zeros(1, dtype=torch.int64))
            self.embedding_shape = tuple(self.model.eval()(numeric, categorical).shape[1:])

    def _keep_first_output(self, module: nn.Module, args: object, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.retain_grad()
            self._first_output = output

    def forward(self, sample_ids: np.ndarray, train: bool) -> torch.Tensor:
        """The activation for these rows (float32, on this party's device); a train forward
        keeps its graph for the backward."""
        numeric, categorical = self.inputs.rows(torch.from_numpy(sample_ids))
        self.model.train(train)
        if not train:
            with torch.no_grad(), self.autocast():
                return self.model(numeric, categorical).float()
        with self.autocast():
            self._activation = self.model(numeric, categorical).float()
        settle(self.device)
        return self._activation.detach()

    def backward(self, cut_gradient: torch.Tensor) -> None:
        """Backprop the received gradient through the bottom model and take one step."""
        if self._activation is None:
            raise RuntimeError("cut gradient received before any train activation was sent")
        self.optimizer.zero_grad(set_to_none=True)
        self._activation.backward(cut_gradient.to(self.device, non_blocking=True))
        self.optimizer.step()
        self._activation = None
        if self._first_output is not None:
            self.first_layer_gradient = self._first_output.grad.float()  # bf16 too: as recorded
            self._first_output = None

    @property
    def pending_shape(self) -> tuple[int, ...] | None:
        """Shape the next cut gradient must have (that of the last train activation)."""
        return None if self._activation is None else tuple(self._activation.shape)

    def state_dict(self) -> dict[str, Any]:
        """The bottom model and its optimizer (any torch.optim.Optimizer, a malicious one
        included, keeps everything it needs in its own state_dict)."""
        return {"party_id": self.party_id, "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["party_id"]) != self.party_id:
            raise ValueError(f"the state is passive party {state['party_id']}'s, not party "
                             f"{self.party_id}'s")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def save(self, path: Path) -> None:
        state = self.state_dict()
        write_atomically(path, lambda tmp: torch.save(state, tmp))
