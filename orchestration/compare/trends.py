"""Leak against strength within a defense family: does the leak fall as the parameter grows?"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from orchestration.compare.table import LEAK_FALLS_AS_IT_RISES


@dataclass(frozen=True)
class Trend:
    family: str
    parameter: str  # e.g. "marvell.s"
    fixed: dict[str, float]  # the family's other varying parameters, held at these values
    attack: str
    levels: list[tuple[float, dict[str, Any]]]  # (parameter value, table row), ascending

    @property
    def direction(self) -> str:
        """"falls" / "rises" when the seed-mean leak is monotone in the parameter, "flat" when
        it does not move, else "mixed". Of the leak, not the figure: a count error that rises
        is a leak that falls."""
        leak = np.array([row["leak_mean"] for _, row in self.levels], dtype=np.float64)
        steps = np.diff(leak) * (-1 if self.levels[0][1].get("metric") in LEAK_FALLS_AS_IT_RISES else 1)
        if steps.size and (steps == 0).all():
            return "flat"
        if steps.size and (steps <= 0).all():
            return "falls"
        if steps.size and (steps >= 0).all():
            return "rises"
        return "mixed"

    @property
    def spearman(self) -> float | None:
        if len(self.levels) < 3:
            return None
        values = [v for v, _ in self.levels]
        leak = [row["leak_mean"] for _, row in self.levels]
        if len(set(leak)) == 1:  # a constant leak has no rank correlation
            return None
        rho = stats.spearmanr(values, leak).statistic
        return None if np.isnan(rho) else float(rho)


def trends(rows: list[dict[str, Any]]) -> list[Trend]:
    """For each family, each parameter that varies, and each setting of the other parameters:
    the attack's leak at every level (at least two) of that parameter."""
    groups: dict[tuple, list[tuple[float, dict[str, Any]]]] = defaultdict(list)
    by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["leak_mean"] is not None:
            by_family[row["family"]].append(row)
    for name, members in by_family.items():
        params = [json.loads(r["strengths"]) for r in members]
        varying = sorted({k for p in params for k in p if len({q.get(k) for q in params}) > 1})
        for parameter in varying:
            for row, p in zip(members, params, strict=True):
                if parameter not in p:
                    continue
                fixed = tuple(sorted((k, v) for k, v in p.items() if k != parameter and k in varying))
                key = (name, parameter, fixed, row["attack"], row["setup"])
                groups[key].append((p[parameter], row))
    return [Trend(f, parameter, dict(fixed), attack, sorted(levels, key=lambda lv: lv[0]))
            for (f, parameter, fixed, attack, _), levels in groups.items() if len(levels) >= 2]
