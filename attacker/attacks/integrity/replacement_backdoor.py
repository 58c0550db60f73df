"""Label replacement backdoor (VFLAIR's LRB; ALGORITHMS.md §2.16): the attack success rate of the
party's trigger on held-out test rows, next to the main-task accuracy."""

from __future__ import annotations

from typing import Any

import numpy as np

from attacker.attacks.base import ATTACKS, RunContext
from attacker.attacks.integrity.base import IntegrityAttack, VariantPass


def success_rates(confusion: np.ndarray, target: int) -> tuple[float, float | None]:
    """(share of the triggered rows predicted as the target: VFLAIR's backdoor accuracy, share of
    those whose true class is another one: the usual attack success rate)."""
    rows = confusion.sum()
    others = np.delete(confusion, target, axis=0)
    asr = float(confusion[:, target].sum() / rows) if rows else float("nan")
    return asr, (float(others[:, target].sum() / others.sum()) if others.sum() else None)


@ATTACKS.register("replacement_backdoor")
class ReplacementBackdoorAttack(IntegrityAttack):
    name = "replacement_backdoor"
    family = "targeted_backdoor"
    vflair = "LRB"
    variant = "backdoor"
    ap_metric = "attack success rate (VFLAIR's backdoor accuracy)"
    side_knowledge = ("a few target-class train rows (known_targets) whose activations it swaps "
                      "for triggered rows'; it triggers its features at inference")

    def figures(self, context: RunContext, passes: list[VariantPass]) -> dict[str, Any]:
        entry = context.cfg.threat.party(context.parties[0])
        assert entry is not None and entry.backdoor is not None
        target = entry.backdoor.target_class
        rates = [success_rates(p.confusion, target) for p in passes]
        asr, non_target = rates[-1]
        # the party knows at most the target class's train rows (splitleak.integrity.known_targets)
        available = int((context.truth(context.train_ids) == target).sum())
        known = min(entry.backdoor.known_targets, available)
        warnings = [] if known == entry.backdoor.known_targets else [
            f"backdoor.known_targets = {entry.backdoor.known_targets}, but only {available} train "
            f"rows have class {target}: the party knew those {known} (summary.json: "
            "integrity.known_targets)"]
        return {"metric": "asr", "value": asr, "ap": asr, "target_class": target,
                "known_targets": known, "warnings": warnings,
                "asr_non_target": non_target, "triggered_accuracy": passes[-1].accuracy,
                "vflair_mean": {"asr": float(np.mean([r[0] for r in rates])),
                                "test_accuracy": float(np.mean([p.test_accuracy for p in passes]))}}
