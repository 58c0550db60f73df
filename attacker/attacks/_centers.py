"""Class-center attacks (GAFM eqs. 8-9): shared parameters, label sources and the score."""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Literal

import numpy as np
from pydantic import Field

from attacker.attacks._batch import as_rows, distances, not_applicable, unscored
from attacker.attacks.base import Attack, AttackParams, AttackResult, SideKnowledge
from attacker.attacks.thresholds import NEARER_POSITIVE_CENTER
from splitleak.settings import MAX_BATCH

CENTERS_SIDE_KNOWLEDGE = (
    "centers=oracle: every label of the batch, the scored row's own included (upper bound, as "
    "GAFM evaluates); centers=oracle_loo: every label but the scored row's (its own gradient is "
    "left out of its class's center); "
    "centers=hint: labels of random rows revealed in rounds of 2*hints until each class has "
    ">= hints or about half the batch is revealed (revealed rows excluded)"
)


class CenterParams(AttackParams):
    centers: Literal["oracle", "oracle_loo", "hint"] = "oracle"
    hints: int = Field(5, ge=1, le=MAX_BATCH, description="known labels wanted per class (hint centers)")


def reveal_cap(n_rows: int) -> int:
    """The most labels hint centers reveal in a batch of `n_rows`: about half, so that most rows
    are left to measure."""
    return max(1, n_rows // 2)


def reveal_labels(
    side: SideKnowledge, n_rows: int, per_class: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows (and labels) revealed in random rounds of 2*per_class until both classes have
    per_class rows, capped at reveal_cap(n_rows)."""
    cap = reveal_cap(n_rows)
    round_size = min(2 * per_class, cap)
    known = np.zeros(n_rows, dtype=bool)
    labels = np.zeros(n_rows, dtype=np.int64)
    # The cap is reached long before this many rounds; the bound only guarantees termination.
    for _ in range(4 * math.ceil(n_rows / round_size) + 1):
        rows, row_labels = side.known_labels(round_size)
        known[rows] = True
        labels[rows] = row_labels
        n_pos = int(np.count_nonzero(labels[known] == 1))
        n_known = int(np.count_nonzero(known))
        if min(n_pos, n_known - n_pos) >= per_class or n_known >= cap:
            break
    rows = np.flatnonzero(known)
    return rows, labels[rows]


class CenterAttack(Attack):
    """r(g) = ||g - c0|| - ||g - c1||, with class centers c0, c1 from oracle or revealed labels
    (oracle_loo: the center of the scored row's own class is taken without that row)."""

    side_knowledge = CENTERS_SIDE_KNOWLEDGE
    Params = CenterParams
    params: CenterParams
    threshold = NEARER_POSITIVE_CENTER

    @staticmethod
    @abstractmethod
    def center(rows: np.ndarray) -> np.ndarray:
        """The center of one class's rows (float64 [d])."""

    @staticmethod
    @abstractmethod
    def centers_without_each(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the center of the class's rows, as `center` gives it; row i: their center without
        row i) for n >= 2 rows: float64 [d] and [n, d]."""

    @property
    def sees_scored_label(self) -> bool:
        return self.params.centers == "oracle"  # the row's own gradient is in its class's center

    @property
    def randomised(self) -> bool:
        return self.params.centers == "hint"

    @property
    def label(self) -> str:
        if self.params.centers != "hint":  # `hints` plays no part in the oracle variants
            return f"{self.name}(centers={self.params.centers})"
        return super().label

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        rows = as_rows(gradients)
        n_rows = rows.shape[0]
        if self.params.centers == "oracle_loo":
            return self._leave_one_out(rows, np.asarray(side.class_labels_oracle()) == 1)
        exclude = np.zeros(n_rows, dtype=bool)
        if self.params.centers == "oracle":
            known, labels = np.arange(n_rows), np.asarray(side.class_labels_oracle())
        else:
            known, labels = reveal_labels(side, n_rows, self.params.hints)
            exclude[known] = True
        positive = labels == 1
        if positive.all() or not positive.any():
            return unscored(n_rows)
        centers = np.stack(
            [self.center(rows[known[~positive]]), self.center(rows[known[positive]])]
        )
        to_center = distances(rows, centers)
        return AttackResult(to_center[:, 0] - to_center[:, 1], exclude)

    def _leave_one_out(self, rows: np.ndarray, positive: np.ndarray) -> AttackResult:
        """Each row against its own class's center without it and the other class's center."""
        counts = {"positive": int(np.count_nonzero(positive)),
                  "negative": int(np.count_nonzero(~positive))}
        lone = [f"{n} {cls}" for cls, n in counts.items() if n < 2]
        if lone:  # a lone row of a class has no center to leave it out of
            return not_applicable(rows.shape[0], f"{' and '.join(lone)} row(s): leave-one-out "
                                  "centers need two rows of each class")
        to_center = np.empty((rows.shape[0], 2))
        for cls, members in enumerate((~positive, positive)):
            whole, without_each = self.centers_without_each(rows[members])
            to_center[members, cls] = np.linalg.norm(rows[members] - without_each, axis=1)
            to_center[~members, cls] = np.linalg.norm(rows[~members] - whole, axis=1)
        return AttackResult(to_center[:, 0] - to_center[:, 1], np.zeros(rows.shape[0], dtype=bool))
