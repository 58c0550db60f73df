"""PPDL (Fu et al. baseline, after Shokri & Shmatikov): share a random Θ_u of coordinates, noisy."""

from __future__ import annotations

import torch
from pydantic import Field

from label_party.defenses.base import DEFENSES, Defense, DefenseContext, DefenseParams
from label_party.defenses.laplace import laplace_noise
from label_party.defenses.rows import as_rows, compute_dtype, is_empty, restore
from label_party.defenses.sparsify import kept_count
from splitleak.settings import MAX_SCALE, MIN_EPSILON


class PpdlParams(DefenseParams):
    theta_u: float = Field(gt=0.0, le=1.0)  # fraction of each row's coordinates shared
    epsilon: float = Field(default=1.8, ge=MIN_EPSILON)
    sensitivity: float = Field(default=1.0, gt=0.0, le=MAX_SCALE)
    gamma: float = Field(default=0.001, gt=0.0, le=MAX_SCALE)  # shared values are clipped to [−γ, γ]
    tau: float = Field(default=1e-4, ge=0.0)  # shared values with |v| < τ are zeroed


@DEFENSES.register("ppdl")
class Ppdl(Defense):
    """Per row: pick round(Θ_u·d) (≥ 1) coordinates uniformly at random without replacement;
    release v = clip(g + Laplace(0, sensitivity/ε), −γ, γ) there, zeroed if |v| < τ; every other
    coordinate is not shared (0).

    Laplace scale = sensitivity/ε per released coordinate: a plain Laplace mechanism; the
    reference code's sparse-vector budget split (scale 2·c·sensitivity/ε₂, c = values released
    per tensor, noisy threshold test) is not reproduced. γ bounds the released values as the
    reference code's `bound(grad + noise, γ)` does (KD^k's paper gives no γ semantics); τ is
    tested on the released value. Not a DP guarantee for the rows: no ε is accounted.
    """

    name = "ppdl"
    Params = PpdlParams
    params: PpdlParams

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if is_empty(cut_gradient):
            return cut_gradient
        rows = as_rows(cut_gradient)
        work = compute_dtype(rows.dtype)
        batch, dim = rows.shape
        keep = kept_count(self.params.theta_u, dim)
        chosen = torch.rand(batch, dim, generator=ctx.generator).topk(keep, dim=1).indices
        chosen = chosen.to(rows.device)
        scale = self.params.sensitivity / self.params.epsilon
        noise = laplace_noise((batch, keep), scale, ctx.generator, work, rows.device)
        gamma = self.params.gamma
        released = (rows.gather(1, chosen).to(work) + noise).clamp(-gamma, gamma)
        released = torch.where(released.abs() < self.params.tau, 0.0, released)
        shared = torch.zeros(batch, dim, dtype=work, device=rows.device).scatter_(1, chosen, released)
        return restore(shared, cut_gradient)
