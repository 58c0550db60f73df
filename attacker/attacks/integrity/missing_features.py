"""Missing features (VFLAIR's MF; ALGORITHMS.md §2.18): the accuracy lost on the rows for which the
attacking party sends nothing (a zero output), a robustness measure."""

from __future__ import annotations

from typing import Any

from attacker.attacks.base import ATTACKS, RunContext
from attacker.attacks.integrity.base import IntegrityAttack, VariantPass


def mixed_accuracy(final: VariantPass) -> float:
    """The test accuracy with the missing rows' predictions in place of their clean ones (VFLAIR
    scores its whole test set with the rows missing): (n·acc − m·clean + m·missing) / n."""
    n, m = final.test_rows, final.rows
    clean = final.accuracy if final.clean_accuracy is None else final.clean_accuracy
    return (n * final.test_accuracy - m * clean + m * final.accuracy) / n


@ATTACKS.register("missing_features")
class MissingFeaturesAttack(IntegrityAttack):
    name = "missing_features"
    family = "non_targeted"
    vflair = "MF"
    variant = "missing"
    ap_metric = "accuracy drop: test accuracy with the rows missing - their accuracy (VFLAIR's)"
    side_knowledge = "none: the party's output is zero for some rows"

    def figures(self, context: RunContext, passes: list[VariantPass]) -> dict[str, Any]:
        final = passes[-1]
        mixed = mixed_accuracy(final)
        paired = None if final.clean_accuracy is None else final.clean_accuracy - final.accuracy
        return {"metric": "accuracy_drop", "value": mixed - final.accuracy,
                "ap": max(0.0, mixed - final.accuracy), "missing_accuracy": final.accuracy,
                "clean_accuracy_same_rows": final.clean_accuracy, "paired_drop": paired,
                "test_accuracy_with_missing": mixed}
