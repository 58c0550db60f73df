"""Gradient compression (Fu et al. baseline): keep the largest-magnitude coordinates, per row or batch."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from label_party.defenses.base import DEFENSES, Defense, DefenseContext, DefenseParams
from label_party.defenses.rows import as_rows, is_empty, restore


class SparsifyParams(DefenseParams):
    kept_fraction: float = Field(gt=0.0, le=1.0)  # Fu et al.: 0.75, 0.5, 0.25, 0.1
    # "row": ours, each row keeps its own top kept_count; "batch": Fu et al.'s TensorPruner,
    # one threshold over the whole [B, d] block (ALGORITHMS.md §3.8).
    scope: Literal["row", "batch"] = "row"


def kept_count(kept_fraction: float, dim: int) -> int:
    """round(kept_fraction·d), half up, and at least 1."""
    return max(1, min(dim, math.floor(kept_fraction * dim + 0.5)))


def batch_threshold_rank(kept_fraction: float, size: int) -> int:
    """Fu et al.'s rank of the threshold: int(size·kept_fraction), at least 1 (theirs fails at 0)."""
    return max(1, int(size * kept_fraction))


@DEFENSES.register("sparsify")
class Sparsify(Defense):
    """scope "row": per row, keep exactly kept_count(kept_fraction, d) largest-|g| coordinates,
    zero the rest (ties broken by torch.topk, so the count is exact).

    scope "batch" (Fu et al.'s `TensorPruner`): t = the n-th largest |g| over the whole [B, d]
    block, n = batch_threshold_rank(kept_fraction, B·d); keep the values with |g| > t, strictly,
    zero the rest: at most n − 1 values survive, and rows of small gradients become all zero.
    Deterministic (no randomness).
    """

    name = "sparsify"
    Params = SparsifyParams
    params: SparsifyParams

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if is_empty(cut_gradient):
            return cut_gradient
        rows = as_rows(cut_gradient)
        if self.params.scope == "batch":
            magnitude = rows.abs()
            rank = batch_threshold_rank(self.params.kept_fraction, magnitude.numel())
            threshold = magnitude.reshape(-1).topk(rank).values[-1]
            kept = torch.where(magnitude > threshold, rows, torch.zeros_like(rows))
            return restore(kept, cut_gradient)
        keep = kept_count(self.params.kept_fraction, rows.shape[1])
        if keep == rows.shape[1]:
            return cut_gradient
        index = rows.abs().topk(keep, dim=1, sorted=False).indices
        kept = torch.zeros_like(rows).scatter_(1, index, rows.gather(1, index))
        return restore(kept, cut_gradient)
