"""Scoring the integrity attacks (ALGORITHMS.md §2.16-2.18) from the label party's evaluations:
each evaluation pass also scored the attack's variant of some test rows (triggered, noisy or
missing at the attacking party); the final pass is the headline, the mean over passes VFLAIR's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attacker.attacks.base import AttackParams, RunAttack, RunContext, RunResult
from splitleak.artifacts.metrics_log import read_metrics_log


@dataclass(frozen=True)
class VariantPass:
    """One evaluation pass: the clean test accuracy and what the variant's rows got."""

    step: int
    test_accuracy: float
    test_rows: int
    accuracy: float  # of the variant's rows, with their true labels
    clean_accuracy: float | None  # of the same rows, clean, in the same pass
    confusion: np.ndarray  # [K, K]: true label (rows) x prediction (columns) of the variant's rows

    @property
    def rows(self) -> int:
        return int(self.confusion.sum())


def variant_passes(context: RunContext, variant: str, what: str) -> list[VariantPass]:
    """Every evaluation pass that scored `variant`; ValueError with a sentence when the threat
    model does not declare the attack for this party (its premise) or the run never scored it."""
    k = context.parties[0]
    entry = context.cfg.threat.party(k)
    if len(context.parties) != 1 or entry is None or variant not in entry.integrity:
        raise ValueError(f"{what} runs for a party whose [threat.parties.K] declares it; party "
                         f"{'+'.join(map(str, context.parties))} does not")
    path = context.run.metrics
    passes = [VariantPass(int(r["step"]), float(r["test_accuracy"]), int(r["test_rows"]),
                          float(r[f"{variant}_accuracy"]), r.get(f"{variant}_clean_accuracy"),
                          np.asarray(r[f"{variant}_confusion"], dtype=np.int64))
              for r in read_metrics_log(path).evals if f"{variant}_confusion" in r]
    if not passes:
        raise ValueError(f"{what}: {path} holds no evaluation of the '{variant}' rows (the label "
                         "party scores them in every evaluation pass of a run that declares it)")
    return passes


class IntegrityAttack(RunAttack):
    """An integrity attack's score, read from the label party's evaluations of its rows."""

    variant: ClassVar[str]  # its rows' variant (splitleak.integrity.VARIANTS)
    ap_metric: ClassVar[str]  # how VFLAIR's attack performance is read
    Params = AttackParams

    @classmethod
    def attack_performance(cls, entry: dict[str, Any]) -> dict[str, Any]:
        figures = entry.get("integrity") or {}
        return {"metric": cls.ap_metric, "value": figures.get("ap")}

    def run(self, context: RunContext) -> RunResult:
        passes = variant_passes(context, self.variant, self.name)
        figures = self.figures(context, passes)
        final = passes[-1]
        warnings = tuple(figures.pop("warnings", ()))
        figures |= {"evaluations": len(passes), "rows": final.rows, "step": final.step,
                    "test_accuracy": final.test_accuracy}
        return RunResult(figures["value"], 0, final.rows, figures, metric=figures["metric"],
                         warnings=warnings)

    def figures(self, context: RunContext, passes: list[VariantPass]) -> dict[str, Any]:
        """The attack's figures: `metric`, `value` (the headline, final pass), `ap` (VFLAIR's
        attack performance) and whatever else explains them."""
        raise NotImplementedError
