"""Fu et al.'s malicious local optimizer: SGD whose every element's step is scaled up adaptively.

A malicious passive party trains its bottom model with it so the top model comes to rely on its
features (the active label inference attack); the label party cannot tell from the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer

EPSILON = 1e-7  # Fu et al.'s guard in g_t / (g_(t-1) + 1e-7)


class MaliciousSGD(Optimizer):
    """Momentum SGD, then per element r = clamp(1 + γ·d_t / (s_(t−1) + 1e−7), low, high),
    step p ← p − lr·r·d_t, and s_t = r·d_t kept for the next step (no scaling on the first step).

    d_t is the update direction of torch.optim.SGD (weight decay added to the gradient, then the
    momentum buffer, Nesterov if asked); the buffer itself stays unscaled. Every tensor lives in
    `self.state`, so `state_dict()` / `load_state_dict()` checkpoint and resume it exactly.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
                 lr: float = 1e-2, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, gamma: float = 1.0,
                 clamp: tuple[float, float] = (1.0, 5.0)) -> None:
        if lr <= 0 or momentum < 0 or weight_decay < 0 or gamma <= 0:
            raise ValueError(f"need lr > 0, momentum >= 0, weight_decay >= 0, gamma > 0; got "
                             f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}, "
                             f"gamma={gamma}")
        if not 0 < clamp[0] <= clamp[1]:
            raise ValueError(f"clamp {clamp} must be (low, high) with 0 < low <= high")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening = 0")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "weight_decay": weight_decay, "nesterov": nesterov, "gamma": gamma,
                    "clamp": tuple(clamp)}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            low, high = group["clamp"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                direction = self._direction(p, p.grad, group)
                state = self.state[p]
                previous = state.get("scaled_direction")
                if previous is not None:
                    ratio = (1.0 + group["gamma"] * direction / (previous + EPSILON)).clamp_(low, high)
                    direction = direction * ratio
                state["scaled_direction"] = direction.clone()
                p.add_(direction, alpha=-group["lr"])
        return loss

    def _direction(self, p: torch.Tensor, grad: torch.Tensor,
                   group: dict[str, Any]) -> torch.Tensor:
        """torch.optim.SGD's update direction for p, whose gradient is `grad` (weight decay,
        momentum, Nesterov)."""
        if group["weight_decay"]:
            grad = grad.add(p, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if not momentum:
            return grad
        state = self.state[p]
        buffer = state.get("momentum_buffer")
        if buffer is None:
            buffer = state["momentum_buffer"] = grad.clone()
        else:
            buffer.mul_(momentum).add_(grad, alpha=1.0 - group["dampening"])
        return grad.add(buffer, alpha=momentum) if group["nesterov"] else buffer
