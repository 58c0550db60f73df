"""The cells of report.md: numbers, intervals over seeds, changes against no defense, tables;
and the words for what a leak or a utility is."""

from __future__ import annotations

import math
from typing import Any

LEAK_LABELS = {
    "flipped_p95": "p95 over batches of the flip-corrected leak AUC",
    "flipped_mean": "mean over batches of the flip-corrected leak AUC",
    "accuracy": "label-inference accuracy",
    "batch_mean": "mean over batches of the attack's metric",
}
UTILITY_LABELS = {"test_auc": "test AUC", "test_accuracy": "test accuracy"}
# what a reconstruction row's leak is, by the attack's metric
METRIC_LABELS = {"ssim": "class-conditional SSIM of the reconstructed inputs",
                 "r2": "mean R² of the reconstructed features",
                 "feature_accuracy": "accuracy of the reconstructed categorical features",
                 "count_error": "mean over batches of the count error (the share of a batch the "
                                "inferred class counts misplace; lower = more leak)"}
METRIC_HEADERS = {"accuracy": "accuracy", "ssim": "SSIM", "r2": "R²",
                  "feature_accuracy": "feature accuracy", "count_error": "count error"}


def num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}"


def ci(row: dict[str, Any], prefix: str) -> str:
    """`mean [low, high]`, an end the metric's range clipped marked † (CLIPPED)."""
    mean = row.get(f"{prefix}_mean")
    if mean is None:
        return "–"
    low, high = row.get(f"{prefix}_ci_low"), row.get(f"{prefix}_ci_high")
    clipped = row.get(f"{prefix}_ci_clipped") or ""
    mark = {end: "†" if clipped in (end, "both") else "" for end in ("low", "high")}
    interval = (f" [{num(low)}{mark['low']}, {num(high)}{mark['high']}]"
                if low is not None and math.isfinite(low) else "")
    return num(mean) + interval


CLIPPED = ("† = the t interval reached beyond the metric's range (e.g. an AUC above 1 with two "
           "seeds, a negative time) and is clipped to it at that end")


def worst_best(row: dict[str, Any], prefix: str) -> str:
    return f"{num(row.get(f'{prefix}_worst'))} / {num(row.get(f'{prefix}_best'))}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def change(row: dict[str, Any], prefix: str) -> str:
    """A relative change against no defense over seeds, e.g. `-20% [-31%, -9%]`."""
    mean = row.get(f"{prefix}_mean")
    if mean is None:
        return "–"
    low, high = row.get(f"{prefix}_ci_low"), row.get(f"{prefix}_ci_high")
    interval = (f" [{low:+.0%}, {high:+.0%}]" if low is not None and math.isfinite(low) else "")
    return f"{mean:+.0%}{interval}"
