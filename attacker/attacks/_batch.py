"""Shared batch helpers for the attacks: float64 row geometry and the "cannot score" result."""

from __future__ import annotations

import numpy as np

from attacker.attacks.base import AttackResult


class _Converted:
    """The float64 rows (and their squared norms, once asked) of the last immutable batch.

    The analysis runs some thirty attacks and draws on each logged batch, and each would
    convert the same rows again; a batch read from the log is immutable (Arrow memory), so its
    conversion can be kept. The source is held, so its memory cannot be reused meanwhile, and
    the kept arrays are read-only, so no attack can change them for the next one."""

    def __init__(self, source: np.ndarray, rows: np.ndarray) -> None:
        self.source, self.rows = source, rows
        self.norms: np.ndarray | None = None

    def matches(self, source: np.ndarray) -> bool:
        return (source is self.source or (
            source.__array_interface__["data"][0] == self.source.__array_interface__["data"][0]
            and source.shape == self.source.shape and source.strides == self.source.strides
            and source.dtype == self.source.dtype))


_last: _Converted | None = None


def _immutable(array: np.ndarray) -> bool:
    """No ndarray on the way to the memory can write it (e.g. a zero-copy view of Arrow data)."""
    owner: object = array
    while isinstance(owner, np.ndarray):
        if owner.flags.writeable:
            return False
        owner = owner.base
    return owner is not None  # a foreign owner (Arrow buffer, bytes); None: own, read-only memory


def as_rows(gradients: np.ndarray) -> np.ndarray:
    """The batch as float64 [B, d], so squares of tiny or huge float32 values stay exact."""
    global _last
    rows = np.asarray(gradients)
    if rows.ndim != 2:
        raise ValueError(f"gradients must be [B, d], got shape {rows.shape}")
    if _last is not None and _immutable(rows) and _last.matches(rows):
        return _last.rows
    converted = rows.astype(np.float64)
    if _immutable(rows):
        converted.flags.writeable = False
        _last = _Converted(rows, converted)
    return converted


def squared_norms(rows: np.ndarray) -> np.ndarray:
    last = _last
    if last is not None and rows is last.rows:
        if last.norms is None:
            norms = np.einsum("ij,ij->i", rows, rows)
            norms.flags.writeable = False
            last.norms = norms
        return last.norms
    return np.einsum("ij,ij->i", rows, rows)


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to unit norm; zero rows stay zero (their cosine with anything is taken as 0)."""
    norms = np.sqrt(squared_norms(rows))
    return rows / np.where(norms > 0, norms, 1.0)[:, None]


SCALAR_ROWS = ("one gradient column per row (a scalar cut output, e.g. GAFM's f(X) with model.top "
               "= \"none\"), so a row's direction is its sign alone")
ONE_SIGN = f"{SCALAR_ROWS}, and every row of this batch has the same sign: no direction tells rows apart"
EVEN_SIGNS = (f"{SCALAR_ROWS}, and the two signs split this batch evenly: neither side is the "
              "minority")


def one_sign(rows: np.ndarray) -> str | None:
    """ONE_SIGN when cosines between these rows carry nothing because the rows are 1-d and share
    one sign (every unit row the same); None otherwise."""
    if rows.shape[0] == 0 or rows.shape[1] != 1 or np.unique(np.sign(rows)).size > 1:
        return None
    return ONE_SIGN


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
