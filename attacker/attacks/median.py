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
    def centers_without_each(rows: np.ndarray) -> np.ndarray:
        # Per coordinate, sort once: without the value of rank r, the remaining m = n - 1
        # values' k-th smallest is the sorted column's k-th if k < r, else its (k+1)-th.
        n = rows.shape[0]
        order = np.argsort(rows, axis=0, kind="stable")
        ordered = np.take_along_axis(rows, order, axis=0)
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(n)[:, None], axis=0)
        columns = np.arange(rows.shape[1])[None]

        def kth(k: int) -> np.ndarray:  # [n, d]: the k-th smallest of each column without row i
            return ordered[np.where(k < rank, k, k + 1), columns]

        m = n - 1
        if m % 2:
            return kth(m // 2)
        return (kth(m // 2 - 1) + kth(m // 2)) / 2
