"""DiscreteSGD (Fu et al. baseline): round every coordinate to the nearest of N+1 fixed levels."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from label_party.defenses.base import DEFENSES, Defense, DefenseContext, DefenseParams
from label_party.defenses.rows import compute_dtype, is_empty
from splitleak.settings import MAX_WIDTH


class DiscreteSgdParams(DefenseParams):
    bins: int = Field(ge=2, le=MAX_WIDTH)  # N sub-intervals of [μ − 2σ, μ + 2σ] (Fu et al.: 6, 12, 18, 24)


@DEFENSES.register("discrete_sgd")
class DiscreteSgd(Defense):
    """Quantise to the N + 1 edges of N equal bins over [μ − 2σ, μ + 2σ], clamping outliers.

    μ, σ: mean and (population) standard deviation over every coordinate of every cut gradient
    this instance saw with ctx.epoch == 0, accumulated exactly in float64 (count, sum, sum of
    squared deviations, merged batch by batch). While epoch 0 runs, each batch uses the estimate
    including itself; the interval is frozen at the first batch with epoch ≥ 1 (or, if no epoch-0
    batch was ever seen, e.g. a resumed run, from that first batch alone). σ = 0 maps all to μ.
    """

    name = "discrete_sgd"
    Params = DiscreteSgdParams
    params: DiscreteSgdParams

    def __init__(self, params: DiscreteSgdParams) -> None:
        super().__init__(params)
        self._count = 0
        self._mean = 0.0
        self._m2 = 0.0  # sum of squared deviations from the mean
        self._interval: tuple[float, float] | None = None

    def _observe(self, values: torch.Tensor) -> None:
        exact = values.to(torch.float64).reshape(-1)
        count = exact.numel()
        mean = float(exact.mean())
        m2 = float((exact - mean).square().sum())
        total = self._count + count
        shift = mean - self._mean
        self._mean += shift * count / total
        self._m2 += m2 + shift * shift * self._count * count / total
        self._count = total

    def _current_interval(self) -> tuple[float, float]:
        std = (self._m2 / self._count) ** 0.5
        return self._mean - 2.0 * std, self._mean + 2.0 * std

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if is_empty(cut_gradient):
            return cut_gradient
        if self._interval is None:
            if ctx.epoch == 0 or self._count == 0:
                self._observe(cut_gradient)
            interval = self._current_interval()
            if ctx.epoch >= 1:
                self._interval = interval
        else:
            interval = self._interval
        low, high = interval
        ctx.diagnostics["discrete_sgd.low"] = low
        ctx.diagnostics["discrete_sgd.high"] = high
        work = compute_dtype(cut_gradient.dtype)
        if high <= low:
            return torch.full_like(cut_gradient, low)
        width = (high - low) / self.params.bins
        steps = ((cut_gradient.to(work) - low) / width).round().clamp(0, self.params.bins)
        return (low + steps * width).to(cut_gradient.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self._count, "mean": self._mean, "m2": self._m2,
                "interval": list(self._interval) if self._interval is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._count, self._mean, self._m2 = int(state["count"]), state["mean"], state["m2"]
        interval = state["interval"]
        self._interval = (interval[0], interval[1]) if interval is not None else None

    def summary(self) -> dict[str, object]:
        frozen = self._interval is not None
        low, high = self._interval or (None, None)
        return {"interval_frozen": frozen, "low": low, "high": high, "values_seen": self._count}
