"""GradPerturb (VFLAIR; Yang et al.): per-class gradients mixed in with Laplace(2/ε) weights."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from label_party.defenses.base import DEFENSES, Defense, DefenseContext, DefenseParams
from label_party.defenses.laplace import laplace_noise
from label_party.defenses.rows import as_rows, compute_dtype, is_empty, restore, row_norms
from splitleak.settings import MIN_EPSILON


class GradPerturbParams(DefenseParams):
    epsilon: float = Field(ge=MIN_EPSILON)  # label-DP ε of the mechanism; Laplace scale 2/ε


@DEFENSES.register("grad_perturb")
class GradPerturb(Defense):
    """g̃_j = g_j + Σ_c u_jc · g_j^(c), u_jc ~ Laplace(0, 2/ε) i.i.d. per row and class.

    g^(c) is ctx.class_gradients[c]: the clean gradient row j would give if its label were c
    (binary BCE: c ∈ {0, 1}). The trainer computes it only for chains holding this defense.
    """

    name = "grad_perturb"
    Params = GradPerturbParams
    params: GradPerturbParams
    needs_class_gradients = True

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if is_empty(cut_gradient):
            return cut_gradient
        per_class = ctx.class_gradients
        if per_class is None or tuple(per_class.shape[1:]) != tuple(cut_gradient.shape):
            got = None if per_class is None else tuple(per_class.shape)
            raise ValueError(f"grad_perturb needs ctx.class_gradients of shape [K, "
                             f"{', '.join(map(str, cut_gradient.shape))}], got {got}")
        rows = as_rows(cut_gradient)
        work = compute_dtype(rows.dtype)
        classes = per_class.shape[0]
        weights = laplace_noise((rows.shape[0], classes), self.scale, ctx.generator, work,
                                rows.device)
        # [B, K] × [K, B, d] → [B, d]: row j mixes its own K per-class gradients.
        noise = torch.einsum("bk,kbd->bd", weights, per_class.reshape(classes, *rows.shape).to(work))
        ctx.diagnostics["grad_perturb.noise_norm_mean"] = float(row_norms(noise).mean())
        ctx.diagnostics["grad_perturb.gradient_norm_mean"] = float(row_norms(rows).mean())
        return restore(rows.to(work) + noise, cut_gradient)

    @property
    def scale(self) -> float:
        return 2.0 / self.params.epsilon

    def summary(self) -> dict[str, Any]:
        return {"epsilon": self.params.epsilon, "laplace_scale": self.scale,
                "mechanism": "g + Σ_c u_c·g^(c), u_c ~ Laplace(0, 2/ε) per row and class"}
