"""perp (Li et al. reference code): noise orthogonal to each row, row norm ~ U[lower, upper]·max."""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from label_party.defenses.base import DEFENSES, Defense, DefenseContext, DefenseParams
from label_party.defenses.rows import as_rows, compute_dtype, is_empty, restore, row_norms
from splitleak.settings import MAX_SCALE


class PerpParams(DefenseParams):
    lower: float = Field(default=1.0, ge=1.0)  # target norm ≥ lower·‖g_max‖ (≥ every row's)
    upper: float = Field(default=10.0, ge=1.0, le=MAX_SCALE)  # target norm ≤ upper·‖g_max‖

    @model_validator(mode="after")
    def _ordered(self) -> PerpParams:
        if self.lower > self.upper:
            raise ValueError(f"lower ({self.lower}) must not exceed upper ({self.upper})")
        return self


@DEFENSES.register("perp")
class Perp(Defense):
    """g̃_j = g_j + sqrt(r_j² − ‖g_j‖²)·w_j, r_j ~ U[lower·‖g_max‖, upper·‖g_max‖], w_j ⟂ g_j.

    w_j is a uniformly random unit vector orthogonal to g_j (any direction for a zero row;
    none exists when d = 1, so such rows pass unchanged). r_j below ‖g_j‖ adds nothing.
    """

    name = "perp"
    Params = PerpParams
    params: PerpParams

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if is_empty(cut_gradient):
            return cut_gradient
        rows = as_rows(cut_gradient)
        work = compute_dtype(rows.dtype)
        batch, dim = rows.shape
        exact = rows.to(torch.float64)
        norms = row_norms(rows).unsqueeze(1)
        max_norm = float(norms.max())
        along = torch.where(norms > 0, exact / torch.where(norms > 0, norms, 1.0), 0.0)
        xi = torch.randn(batch, dim, generator=ctx.generator, dtype=torch.float64).to(rows.device)
        perp = xi - (xi * along).sum(dim=1, keepdim=True) * along
        perp_norm = torch.linalg.vector_norm(perp, dim=1, keepdim=True)
        unit = torch.where(perp_norm > 0, perp / torch.where(perp_norm > 0, perp_norm, 1.0), 0.0)
        lower, upper = self.params.lower * max_norm, self.params.upper * max_norm
        target = lower + (upper - lower) * torch.rand(
            batch, 1, generator=ctx.generator, dtype=torch.float64
        ).to(rows.device)
        length = ((target - norms) * (target + norms)).clamp_min(0.0).sqrt()
        return restore(rows.to(work) + (length * unit).to(work), cut_gradient)
