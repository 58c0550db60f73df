"""Noisy gradients (Fu et al. baseline): i.i.d. Laplace(0, b) noise on every coordinate."""

from __future__ import annotations

import torch
from pydantic import Field

from label_party.defenses.base import DEFENSES, Defense, DefenseContext, DefenseParams
from label_party.defenses.rows import compute_dtype, is_empty
from splitleak.settings import MAX_SCALE


class LaplaceParams(DefenseParams):
    b: float = Field(gt=0.0, le=MAX_SCALE)  # Laplace scale (Fu et al.: 1e-4 … 1e-1)


def laplace_noise(
    shape: tuple[int, ...], scale: float, generator: torch.Generator, dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Laplace(0, scale) by inversion of one uniform per value: sign × Exponential(scale).
    Drawn with the (CPU) generator, then moved to `device`: the same noise on every device."""
    uniform = torch.rand(shape, generator=generator, dtype=dtype).to(device)  # in [0, 1)
    negative = uniform < 0.5
    half = torch.where(negative, 2.0 * uniform, 2.0 * uniform - 1.0)  # uniform in [0, 1) again
    magnitude = -torch.log1p(-half) * scale  # finite: 1 − half ∈ (0, 1]
    return torch.where(negative, -magnitude, magnitude)


@DEFENSES.register("laplace")
class Laplace(Defense):
    """g̃ = g + η, η_i ~ Laplace(0, b) i.i.d."""

    name = "laplace"
    Params = LaplaceParams
    params: LaplaceParams

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if is_empty(cut_gradient):
            return cut_gradient
        work = compute_dtype(cut_gradient.dtype)
        noise = laplace_noise(tuple(cut_gradient.shape), self.params.b, ctx.generator, work,
                              cut_gradient.device)
        return (cut_gradient.to(work) + noise).to(cut_gradient.dtype)
