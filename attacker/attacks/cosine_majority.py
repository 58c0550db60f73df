"""Cosine majority-vote attack (Li et al.): positives, the minority, agree with fewer rows."""

from __future__ import annotations

import numpy as np

from attacker.attacks._batch import (
    EVEN_SIGNS,
    as_rows,
    no_rows_excluded,
    not_applicable,
    one_sign,
    squared_norms,
    unit_rows,
)
from attacker.attacks.base import ATTACKS, Attack, AttackResult, SideKnowledge

# Gram-matrix entries computed per block, so a 32k-row batch never holds a B x B matrix.
_BLOCK_ENTRIES = 1 << 22


@ATTACKS.register("cosine_majority")
class CosineMajorityAttack(Attack):
    name = "cosine_majority"
    family = "label_inference"
    side_knowledge = "positives are the minority class"

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        rows = as_rows(gradients)
        n_rows = rows.shape[0]
        reason = one_sign(rows)
        if n_rows and rows.shape[1] == 1 and np.all(rows) and 2 * np.count_nonzero(rows > 0) == n_rows:
            reason = EVEN_SIGNS  # every row agrees with as many others: all scores tie
        if reason is not None:
            return not_applicable(n_rows, reason)
        # Only the sign of each cosine matters, so float32 unit rows suffice for the product
        # (normalising first keeps tiny gradients from underflowing to a zero inner product).
        units = unit_rows(rows).astype(np.float32)
        agree = np.empty(n_rows, dtype=np.int64)
        block = max(1, _BLOCK_ENTRIES // max(n_rows, 1))
        for start in range(0, n_rows, block):
            cosines = units[start : start + block] @ units.T
            agree[start : start + block] = np.count_nonzero(cosines > 0, axis=1)
        agree -= squared_norms(rows) > 0  # a non-zero row agrees with itself
        return AttackResult(-agree.astype(np.float64), no_rows_excluded(n_rows))
