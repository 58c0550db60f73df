"""max_norm (Li et al.): scale each row by 1 + σ_j·z so every row's expected ‖g̃_j‖² is the max."""

from __future__ import annotations

import torch

from label_party.defenses.base import DEFENSES, Defense, DefenseContext
from label_party.defenses.rows import as_rows, compute_dtype, is_empty, restore, row_norms


@DEFENSES.register("max_norm")
class MaxNorm(Defense):
    """g̃_j = g_j·(1 + σ_j·z_j), σ_j = sqrt(‖g_max‖²/‖g_j‖² − 1), z_j ~ N(0, 1); zero rows stay 0."""

    name = "max_norm"

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if is_empty(cut_gradient):
            return cut_gradient
        rows = as_rows(cut_gradient)
        work = compute_dtype(rows.dtype)
        exact = rows.to(torch.float64)
        norms = row_norms(rows).unsqueeze(1)
        unit = torch.where(norms > 0, exact / torch.where(norms > 0, norms, 1.0), 0.0)
        largest = norms.max()
        # g_j·σ_j = (g_j/‖g_j‖)·sqrt(‖g_max‖² − ‖g_j‖²): no division by a tiny ‖g_j‖².
        amplitude = ((largest - norms) * (largest + norms)).clamp_min(0.0).sqrt()
        z = torch.randn(rows.shape[0], 1, generator=ctx.generator, dtype=work).to(rows.device)
        return restore(rows.to(work) + z * (amplitude * unit).to(work), cut_gradient)
