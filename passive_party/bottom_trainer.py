"""A passive party's math: bottom model forward on its own rows, backward from the cut gradient."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from passive_party.integrity import PartyIntegrity
from passive_party.malicious_optimizer import MaliciousSGD
from splitleak.checkpoint import save_torch
from splitleak.config import ExperimentConfig
from splitleak.cuda_graphs import GraphedTrainStep, ineligible
from splitleak.inputs import PartyInputs
from splitleak.models import build_bottom
from splitleak.optim import make_optimizer
from splitleak.placement import autocast, settle
from splitleak.seeding import derive_seed
from splitleak.white_box import SnapshotWriter


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
                 integrity: PartyIntegrity | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.party_id = party_id
        self.device = torch.device(device)
        self.inputs = inputs.to(self.device)
        self.integrity = integrity  # the threat model's integrity attacks (None: honest)
        self._swap: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, poisoned output)
        self._zeroed: torch.Tensor | None = None  # rows sent as missing
        # CAFE's threat model: the bottom and its aggregated gradients per snapshot step, written
        # for the attacker (evaluation only); set by whoever runs the party.
        self.snapshots: SnapshotWriter | None = None
        self._batch: tuple[int, int, np.ndarray] | None = None  # (epoch, step, ids) of the activation
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
        # run.cuda_graphs: the train step as two graph replays (None: eager, `graphs_off` says why)
        self.graphs: GraphedTrainStep | None = None
        self.graphs_off = ineligible(self.model, self.device, capture_first_layer,
                                     integrity is not None) if cfg.run.cuda_graphs else "not asked"
        if self.graphs_off is None:
            self.graphs = GraphedTrainStep(self.model, cfg.training.batch_size,
                                           cfg.training.precision == "bf16")

    def _keep_first_output(self, module: nn.Module, args: object, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.retain_grad()
            self._first_output = output

    def forward(self, sample_ids: np.ndarray, train: bool, epoch: int = 0, step: int = 0,
                variant: str = "") -> torch.Tensor:
        """The activation for these rows (float32, on this party's device); a train forward
        keeps its graph for the backward. `epoch` and `step` name the batch, `variant` the
        integrity attack EVAL rows are scored under; an honest party ignores them."""
        if train:
            self._batch = (epoch, step, sample_ids)
        if self.integrity is not None:
            return self._deviating_forward(sample_ids, train, epoch, step, variant)
        numeric, categorical = self.inputs.rows(torch.from_numpy(sample_ids))
        self.model.train(train)
        if not train:
            with torch.no_grad(), self.autocast():
                return self.model(numeric, categorical).float()
        if self.graphs is not None:  # the graph's output is overwritten by its next replay
            self._activation = self.graphs(numeric, categorical)
            settle(self.device)
            return self._activation.detach().clone()
        with self.autocast():
            self._activation = self.model(numeric, categorical).float()
        settle(self.device)
        return self._activation.detach()

    def _deviating_forward(self, sample_ids: np.ndarray, train: bool, epoch: int, step: int,
                           variant: str) -> torch.Tensor:
        """The threat model's integrity attacks (passive_party/integrity.py): triggered or noisy
        EVAL rows, a train batch's known target rows swapped for a triggered row (the backdoor),
        rows sent as zeros (missing features)."""
        integrity = self.integrity
        assert integrity is not None
        self.model.train(train)
        zeroed = integrity.zeroed(sample_ids.size, train, step, variant)
        zeroed = zeroed.to(self.device) if zeroed is not None else None
        if not train:
            with torch.no_grad():
                out = self.model(*integrity.rows(self.inputs, sample_ids, variant))
            return out.masked_fill(zeroed.view(-1, *[1] * (out.dim() - 1)), 0.0) \
                if zeroed is not None else out
        swap = integrity.swap(sample_ids, epoch)
        poisoned = None
        if swap is not None:  # first, so the first-layer capture keeps the batch's own forward
            numeric, categorical = self.inputs.rows(torch.tensor([swap.poisoned]))
            poisoned = self.model(integrity.trigger(numeric), categorical)
        self._activation = self.model(*self.inputs.rows(torch.from_numpy(sample_ids)))
        sent = self._activation.detach().clone()
        if swap is not None and poisoned is not None:
            sent[swap.rows] = poisoned.detach()
            self._swap = (swap.rows, poisoned)
        if zeroed is not None:
            sent[zeroed] = 0.0
            self._zeroed = zeroed
        return sent

    def backward(self, cut_gradient: torch.Tensor) -> None:
        """Backprop the received gradient through the bottom model and take one step."""
        if self._activation is None:
            raise RuntimeError("cut gradient received before any train activation was sent")
        self.optimizer.zero_grad(set_to_none=True)
        received = cut_gradient = cut_gradient.to(self.device, non_blocking=True)
        if self._zeroed is not None:  # a missing row's output is a constant: no gradient
            cut_gradient = cut_gradient.masked_fill(
                self._zeroed.view(-1, *[1] * (cut_gradient.dim() - 1)), 0.0)
        if self._swap is not None:
            # VFLAIR's replacement: the target rows' gradient also trains the triggered row
            rows, poisoned = self._swap
            torch.autograd.backward([self._activation, poisoned],
                                    [cut_gradient, cut_gradient[rows].sum(0, keepdim=True)])
        else:
            self._activation.backward(cut_gradient)
        if self.snapshots is not None and self._batch is not None:
            self._snapshot(received)
        self.optimizer.step()
        self._activation, self._swap, self._zeroed = None, None, None
        if self._first_output is not None:
            gradient = self._first_output.grad
            assert gradient is not None  # retain_grad() on an output the backward went through
            self.first_layer_gradient = gradient.float()  # bf16 too: as recorded
            self._first_output = None

    def _snapshot(self, received: torch.Tensor) -> None:
        """The parameters before this step's update, their aggregated gradients and the cut
        gradient received, at a snapshot step (CAFE's white box; splitleak.white_box)."""
        assert self.snapshots is not None and self._batch is not None
        epoch, step, ids = self._batch
        grads = {f"grad.{name}": p.grad if p.grad is not None else torch.zeros_like(p)
                 for name, p in self.model.named_parameters()}
        self.snapshots.record(epoch, step, self.model, {**grads, "cut_gradient": received}, ids)

    @property
    def cuda_graphs(self) -> str:
        """How the train steps ran, for timing.json: "graphs", or "eager: " and why."""
        if self.graphs is None:
            return f"eager: {self.graphs_off}"
        if self.graphs.failure is not None:
            return f"eager: {self.graphs.failure}"
        return "graphs" if self.graphs.replays else "eager: no train batch of the run's batch size"

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
        save_torch(path, state)
