"""Batch-pairwise sums in row blocks, recomputed in backward: O(block·B) memory, not O(B²)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

# Pairwise entries held at once (forward, and again in backward): 2^22 float64 = 32 MiB.
BLOCK_ENTRIES = 1 << 22

BlockFn = Callable[..., torch.Tensor]


def flat_rows(activation: torch.Tensor) -> torch.Tensor:
    """[B, *shape] → [B, d] in float64: the pairwise sums cancel large terms."""
    return activation.reshape(activation.shape[0], -1).to(torch.float64)


def row_reduce(block_fn: BlockFn, rows: torch.Tensor, *per_row: torch.Tensor) -> torch.Tensor:
    """Stack `block_fn(rows[s], rows, *(t[s] for t in per_row))` over row blocks s.

    `block_fn` sees a block of rows against every row ([b, B] pairwise values at most) and
    returns one value (or vector) per row of the block. Each block is checkpointed, so the
    autograd graph keeps only the inputs and recomputes the block's pairwise values in
    backward: peak memory O(BLOCK_ENTRIES), whatever the batch size.
    """
    n_rows = rows.shape[0]
    block = max(1, BLOCK_ENTRIES // max(n_rows, 1))
    parts = []
    for start in range(0, n_rows, block):
        piece = slice(start, start + block)
        args = (rows[piece], rows, *(t[piece] for t in per_row))
        if torch.is_grad_enabled() and rows.requires_grad:
            parts.append(checkpoint(block_fn, *args, use_reentrant=False))
        else:
            parts.append(block_fn(*args))
    return torch.cat(parts)
