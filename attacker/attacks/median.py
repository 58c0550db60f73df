"""Median attack (GAFM eq. 9): distance to the coordinate-wise class medians of the gradients."""

from __future__ import annotations

import numpy as np

from attacker.attacks._centers import CenterAttack
from attacker.attacks.base import ATTACKS


@ATTACKS.register("median")
class MedianAttack(CenterAttack):
    name = "median"
    family = "label_inference"

    @staticmethod
    def center(rows: np.ndarray) -> np.ndarray:
        # Along contiguous memory (a transposed copy): the same medians, ~25 % less time.
        return np.median(np.ascontiguousarray(rows.T), axis=1)

    @staticmethod
    def centers_without_each(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # Without row i, n - 1 values are left, and their median depends only on where row i
        # sits against the middle order statistics of all n (a copy of a tied value leaves the
        # same values whichever copy goes): one selection per coordinate, no sort.
        n = rows.shape[0]
        columns = np.ascontiguousarray(rows.T)  # selections along contiguous memory
        if n % 2 == 0:  # n - 1 odd: the median is the middle value left
            middle = [n // 2 - 1, n // 2]
            lower, upper = np.partition(columns, middle, axis=1)[:, middle].T
            return (lower + upper) / 2, np.where(rows <= lower, upper, lower)
        middle = [n // 2 - 1, n // 2, n // 2 + 1]  # n - 1 even: the mean of the two middle left
        below, center, above = np.partition(columns, middle, axis=1)[:, middle].T
        return center, np.where(rows < center, (center + above) / 2,
                                np.where(rows > center, (below + center) / 2, (below + above) / 2))
