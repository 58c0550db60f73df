"""Gradient compression (Fu et al. baseline): keep each row's largest-magnitude coordinates."""

from __future__ import annotations

import math

import torch
from pydantic import Field

from label_party.defenses.base import DEFENSES, Defense, DefenseContext, DefenseParams
from label_party.defenses.rows import as_rows, is_empty, restore


class SparsifyParams(DefenseParams):
    kept_fraction: float = Field(gt=0.0, le=1.0)  # Fu et al.: 0.75, 0.5, 0.25, 0.1


def kept_count(kept_fraction: float, dim: int) -> int:
    """round(kept_fraction·d), half up, and at least 1."""
    return max(1, min(dim, math.floor(kept_fraction * dim + 0.5)))


@DEFENSES.register("sparsify")
class Sparsify(Defense):
    """Per row, keep exactly kept_count(kept_fraction, d) largest-|g| coordinates; zero the rest.

    Ties are broken by torch.topk, so the count is exact. Deterministic (no randomness).
    """

    name = "sparsify"
    Params = SparsifyParams
    params: SparsifyParams

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if is_empty(cut_gradient):
            return cut_gradient
        rows = as_rows(cut_gradient)
        keep = kept_count(self.params.kept_fraction, rows.shape[1])
        if keep == rows.shape[1]:
            return cut_gradient
        index = rows.abs().topk(keep, dim=1, sorted=False).indices
        kept = torch.zeros_like(rows).scatter_(1, index, rows.gather(1, index))
        return restore(kept, cut_gradient)
