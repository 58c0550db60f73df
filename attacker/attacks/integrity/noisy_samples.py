"""Noisy samples at inference (VFLAIR's NSB; ALGORITHMS.md §2.17): how much accuracy the attacking
party's noise on its features of some test rows costs the model."""

from __future__ import annotations

from typing import Any

import numpy as np

from attacker.attacks.base import ATTACKS, RunContext
from attacker.attacks.integrity.base import IntegrityAttack, VariantPass


@ATTACKS.register("noisy_samples")
class NoisySamplesAttack(IntegrityAttack):
    name = "noisy_samples"
    family = "non_targeted"
    vflair = "NSB"
    variant = "noisy"
    ap_metric = "accuracy drop: test accuracy - accuracy of the noisy rows (VFLAIR's)"
    side_knowledge = "none: the party adds noise to its own features of some test rows"

    def figures(self, context: RunContext, passes: list[VariantPass]) -> dict[str, Any]:
        final = passes[-1]
        drop = final.test_accuracy - final.accuracy
        paired = None if final.clean_accuracy is None else final.clean_accuracy - final.accuracy
        return {"metric": "accuracy_drop", "value": drop, "ap": max(0.0, drop),
                "noisy_accuracy": final.accuracy, "clean_accuracy_same_rows": final.clean_accuracy,
                "paired_drop": paired,
                "vflair_mean": {"test_accuracy": float(np.mean([p.test_accuracy for p in passes])),
                                "noisy_accuracy": float(np.mean([p.accuracy for p in passes]))}}
