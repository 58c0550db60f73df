"""Shared batch helpers for the attacks: float64 row geometry and the "cannot score" result."""

from __future__ import annotations

import numpy as np

from attacker.attacks.base import AttackResult


def as_rows(gradients: np.ndarray) -> np.ndarray:
    """The batch as float64 [B, d], so squares of tiny or huge float32 values stay exact."""
    rows = np.asarray(gradients)
    if rows.ndim != 2:
        raise ValueError(f"gradients must be [B, d], got shape {rows.shape}")
    return rows.astype(np.float64)


def squared_norms(rows: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", rows, rows)


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to unit norm; zero rows stay zero (their cosine with anything is taken as 0)."""
    norms = np.sqrt(squared_norms(rows))
    return rows / np.where(norms > 0, norms, 1.0)[:, None]


def distances(rows: np.ndarray, points: np.ndarray) -> np.ndarray:
    """[B, k] Euclidean distances from every row to each of k points, via one matrix product."""
    squared = squared_norms(rows)[:, None] - 2.0 * (rows @ points.T) + squared_norms(points)[None]
    return np.sqrt(np.maximum(squared, 0.0))


def no_rows_excluded(n_rows: int) -> np.ndarray:
    return np.zeros(n_rows, dtype=bool)


def unscored(n_rows: int) -> AttackResult:
    """The side knowledge was unavailable (e.g. no positive to pick): nothing to measure."""
    return AttackResult(values=np.zeros(n_rows), exclude=np.ones(n_rows, dtype=bool))


def not_applicable(n_rows: int, reason: str) -> AttackResult:
    """The batch is outside what the attack can work on (e.g. not logit gradients)."""
    return AttackResult(values=np.zeros(0), exclude=np.zeros(n_rows, dtype=bool), skip_reason=reason)
