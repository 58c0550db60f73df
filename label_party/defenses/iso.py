"""iso (Li et al.): isotropic Gaussian noise scaled to the batch's largest row norm."""

from __future__ import annotations

import torch
from pydantic import Field

from label_party.defenses.base import DEFENSES, Defense, DefenseContext, DefenseParams
from label_party.defenses.rows import as_rows, compute_dtype, is_empty, restore, row_norms
from splitleak.settings import MAX_SCALE


class IsoParams(DefenseParams):
    # noise variance per coordinate = t·‖g_max‖²/d (reference ratio = √t)
    t: float = Field(ge=0.0, le=MAX_SCALE)


@DEFENSES.register("iso")
class Iso(Defense):
    """g̃_j = g_j + η_j, η_j ~ N(0, (t/d)·‖g_max‖²·I_d)."""

    name = "iso"
    Params = IsoParams
    params: IsoParams

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if is_empty(cut_gradient):
            return cut_gradient
        rows = as_rows(cut_gradient)
        work = compute_dtype(rows.dtype)
        batch, dim = rows.shape
        largest = float(row_norms(rows).max())
        std = largest * (self.params.t / dim) ** 0.5
        ctx.diagnostics["iso.noise_power"] = self.params.t * largest**2  # E‖η_j‖², Marvell's P
        noise = torch.randn(batch, dim, generator=ctx.generator, dtype=work).to(rows.device)
        return restore(torch.add(rows.to(work), noise, alpha=std), cut_gradient)
