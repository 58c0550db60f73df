"""Mean attack (GAFM eq. 8): distance to the class means of the gradients."""

from __future__ import annotations

import numpy as np

from attacker.attacks._centers import CenterAttack
from attacker.attacks.base import ATTACKS


@ATTACKS.register("mean")
class MeanAttack(CenterAttack):
    name = "mean"
    family = "label_inference"

    @staticmethod
    def center(rows: np.ndarray) -> np.ndarray:
        return rows.mean(axis=0)

    @staticmethod
    def centers_without_each(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return rows.mean(axis=0), (rows.sum(axis=0) - rows) / (rows.shape[0] - 1)
