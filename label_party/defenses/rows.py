"""Plumbing shared by the defenses: one flat row per example, and the dtype to compute in."""

from __future__ import annotations

import torch


def as_rows(cut_gradient: torch.Tensor) -> torch.Tensor:
    """[B, *shape] → [B, d] (a view when possible; never written to in place)."""
    return cut_gradient.reshape(cut_gradient.shape[0], -1)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other float type is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def restore(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B, d] → the shape and dtype of `like`."""
    return rows.reshape(like.shape).to(like.dtype)


def is_empty(cut_gradient: torch.Tensor) -> bool:
    """No rows or no coordinates: every defense passes such a batch through unchanged."""
    return cut_gradient.numel() == 0


def row_norms(rows: torch.Tensor) -> torch.Tensor:
    """Euclidean norm of each row, in float64."""
    return torch.linalg.vector_norm(rows.to(torch.float64), dim=1)
