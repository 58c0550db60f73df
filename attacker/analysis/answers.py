"""An attack's answer for one batch, checked: what raised in it, or what it returned outside
AttackResult's form (one value per row, NaN-free scores), named as its plug-in."""

from __future__ import annotations

import numpy as np

from attacker.attacks.base import Attack, AttackResult, SideKnowledge
from splitleak.provenance import PluginError, blamed, described, plugin_origin


class AttackError(PluginError):
    """An attack that raised, or returned other than an AttackResult of its batch's form; the
    message names the attack (its entry point and package where installed)."""


def attack_answer(attack: Attack, gradients: np.ndarray, side: SideKnowledge, metric: str,
                  num_classes: int, labels: np.ndarray) -> AttackResult:
    """`attack(gradients, side)`; AttackError naming it where it raised or returned a result
    the metric cannot read (a built-in's own exception passes unchanged). `labels`: the batch's
    true labels: a leak AUC whose kept rows hold one class reads no score (the batch is
    skipped)."""
    with blamed("attack", attack.name, type(attack), "__call__", AttackError):
        result = attack(gradients, side)
    problem = _problem(result, gradients.shape[0], metric, num_classes, side.used, labels)
    if problem:
        raise AttackError(f"{plugin_origin('attack', attack.name, type(attack))}: __call__() "
                          f"returned {problem}")
    return result


def _problem(result: object, n_rows: int, metric: str, num_classes: int,
             used: np.ndarray, labels: np.ndarray) -> str | None:
    if not isinstance(result, AttackResult):
        return f"a {type(result).__name__}; it must return an AttackResult"
    if result.skip_reason is not None:
        return None
    values, exclude = result.values, result.exclude
    if metric == "count_error":
        want = f"one count per class [{num_classes}]"
        shape: tuple[int, ...] = (num_classes,)
    else:
        want = f"one value per row of the batch [{n_rows}]"
        shape = (n_rows,)
    if not isinstance(values, np.ndarray) or values.shape != shape or values.dtype.kind not in "biuf":
        return f"values as {described(values)}; it must be a numeric array of {want}"
    if metric != "count_error" and (not isinstance(exclude, np.ndarray) or exclude.shape != shape):
        return f"exclude as {described(exclude)}; it must be a bool array [{n_rows}]"
    kept = ~(exclude.astype(bool) | used) if metric != "count_error" else None
    read = values if kept is None else values[kept]
    if metric == "auc" and np.unique(labels[kept]).size < 2:
        return None  # one class kept: no AUC, the batch is skipped, its scores unread
    if read.dtype.kind == "f" and np.isnan(read).any():  # of the values the metric reads
        return (f"{int(np.isnan(read).sum())} NaN value(s) of the {read.size} the metric reads; "
                "a batch it cannot attack is AttackResult(..., skip_reason='why')")
    return None

