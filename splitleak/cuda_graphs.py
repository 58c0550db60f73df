"""A bottom's train forward and backward replayed as CUDA graphs: one launch each, not hundreds."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

log = logging.getLogger("splitleak.cuda_graphs")
# torch.cuda.make_graphed_callables: (module, sample args) -> the module, forward graphed
Capture = Callable[..., Any]


class _TrainForward(nn.Module):
    """What a train step runs up to the cut: the model (under bf16 autocast if asked, without
    autocast's cast cache, which a graph cannot hold), its output as float32."""

    def __init__(self, model: nn.Module, bf16: bool) -> None:
        super().__init__()
        self.model = model
        self.bf16 = bf16

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        cast = (torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False) if self.bf16
                else contextlib.nullcontext())
        with cast:
            return self.model(numeric, categorical).float()


def ineligible(model: nn.Module, device: torch.device, hooked: bool, deviating: bool) -> str | None:
    """Why this bottom's train step cannot be a graph, or None: a graph needs CUDA, replays only
    the model (a hook or an integrity attack runs Python of its own each step) and would draw
    random numbers other than an eager step would (dropout)."""
    if device.type != "cuda":
        return f"the party computes on {device}, not on CUDA"
    if hooked:
        return "the first layer's gradient is recorded (a hook runs every step)"
    if deviating:
        return "the party deviates (an integrity attack changes its rows every step)"
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return "the model has dropout (its random masks would differ from an eager step's)"
    return None


class GraphedTrainStep:
    """`model`'s train forward at the run's batch size as one CUDA graph, whose backward replays
    a second one (torch.cuda.make_graphed_callables); any other batch (an epoch's last, shorter
    one) runs eagerly. Capturing runs a few warm-up steps first; the model's buffers (batch
    norm's running statistics) and the device's random state are put back after them, so the
    run continues as if nothing had run. A capture that fails leaves the party eager, saying why
    (`failure`)."""

    def __init__(self, model: nn.Module, batch_size: int, bf16: bool,
                 capture: Capture | None = None) -> None:
        self.model = model
        self.batch_size = batch_size
        self.bf16 = bf16
        self.eager = _TrainForward(model, bf16)  # the capture patches the module it graphs
        self._capture: Capture = capture or torch.cuda.make_graphed_callables
        self._graphed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        self._shape: tuple[torch.Size, torch.Size] | None = None
        self.failure: str | None = None
        self.replays = 0  # train steps that ran as graphs

    def __call__(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        shape = (numeric.shape, categorical.shape)
        if self._graphed is None and self.failure is None and numeric.shape[0] == self.batch_size:
            self._graphed, self._shape = self._graph(numeric, categorical), shape
        if self._graphed is not None and shape == self._shape:
            self.replays += 1
            return self._graphed(numeric, categorical)
        return self.eager(numeric, categorical)

    def _graph(self, numeric: torch.Tensor,
               categorical: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        buffers = [b.detach().clone() for b in self.model.buffers()]
        device = numeric.device
        rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        try:
            return self._capture(_TrainForward(self.model, self.bf16),
                                 (numeric.clone(), categorical.clone()),
                                 allow_unused_input=True)
        except RuntimeError as err:  # an op a graph cannot hold (a host sync, a dynamic shape)
            self.failure = str(err).splitlines()[0][:300]
            log.warning("the train step runs eagerly: capturing it as a CUDA graph failed (%s)",
                        self.failure)
            return None
        finally:
            with torch.no_grad():
                for live, saved in zip(self.model.buffers(), buffers, strict=True):
                    live.copy_(saved)
            if rng is not None:
                torch.cuda.set_rng_state(rng, device)
