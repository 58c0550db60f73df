"""The run-level leak entries of a report/summary.json as the comparison sees them: the one
adapter that knows the summary's layout."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from splitleak.artifacts.summary import LeakSummary, LeakSummaryEntry

DEFAULT_ATTACK_TYPE = "label inference"  # VFLAIR's LI type: every attack on the gradients
# Feature reconstruction (VFLAIR's FR type): the entry's metric names its headline statistic.
RECONSTRUCTION_METRICS = ("ssim", "r2", "feature_accuracy")
# VFLAIR's attack families (its T-DCS types), as each attack plug-in declares its own.
FAMILIES = {"label_inference": "label inference", "feature_reconstruction": "feature reconstruction",
            "targeted_backdoor": "targeted backdoor", "non_targeted": "non-targeted"}
# where a summary entry keeps each metric's statistics over batches (mean, p95, max)
BATCH_STATS = {"auc": "flipped", "accuracy": "accuracy", "count_error": "count_error",
               **{m: m for m in RECONSTRUCTION_METRICS}}


def _completion_figures(figures: dict[str, Any]) -> dict[str, Any]:
    """Model completion's headline is its train top-1; beside it its test top-1 and, when the
    run trained them, each baseline's (labelled rows only; a random bottom) on both splits."""
    out = {"test": (figures.get("test") or {}).get("top1")}
    for baseline, splits in (figures.get("baselines") or {}).items():
        for split in ("train", "test"):
            out[f"{baseline} {split}"] = (splits.get(split) or {}).get("top1")
    return out


# A run-level attack's further figures: the summary entry's key -> figure name -> value.
FIGURES = {"completion": _completion_figures}


@dataclass(frozen=True)
class LeakEntry:
    """One attack's run-level leak at one party and layer."""

    attack: str
    party: int
    layer: str
    metric: str  # "auc", "accuracy", "count_error", or a reconstruction's ("ssim", "r2", ...)
    side_knowledge: str
    attack_type: str
    flipped_mean: float | None = None  # flip-corrected max(AUC, 1 - AUC), mean over batches
    flipped_p95: float | None = None
    raw_mean: float | None = None
    raw_p95: float | None = None
    # pooled over rows when the summary has it, else batch mean; a reconstruction's headline
    accuracy: float | None = None
    spread: float | None = None  # spread of the headline across random side-knowledge draws
    # score attacks: mean over batches of the threshold rule's accuracy (VFLAIR's AP), the rule
    threshold_accuracy: float | None = None
    threshold_rule: str | None = None
    # why the attack was not scored in the run: its premise fails (`premise`), or a run-level
    # attack gave up on it (`error`, e.g. EXACT without a white-box party); never a figure
    premise: str | None = None
    diagnostic: str | None = None  # why the figure is a diagnostic, not the comparable one
    ap: float | None = None  # VFLAIR's attack performance, as the attack's plug-in reads it
    vflair: str | None = None  # VFLAIR's name for the attack (NS, DS, …), if it has one
    vflair_declared: bool = True  # False: the summary predates the names each plug-in declares
    # the per-batch metric (flip-corrected AUC, accuracy, count error) over batches
    batch_mean: float | None = None
    batch_p95: float | None = None
    figures: dict[str, float | None] = field(default_factory=dict)  # a run-level attack's others

    @property
    def in_vflair(self) -> bool:
        """VFLAIR has this attack (its entry names VFLAIR's counterpart): the attacks VFLAIR's
        T-DCS and C-DCS average over, here and in examples/vflair/tdcs.py."""
        return self.vflair is not None


def number(value: Any) -> float | None:
    if isinstance(value, dict):  # a spread given per statistic: its standard deviation, else the
        value = value.get("std", value.get("sd", value.get("mean")))  # spread of the mean
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _spread(entry: LeakSummaryEntry, part: str) -> float | None:
    spread = entry.get("spread")
    if isinstance(spread, dict) and part in spread:
        spread = spread[part]
    if isinstance(spread, dict) and isinstance(spread.get("p95"), dict):
        spread = spread["p95"]  # per statistic: the headline's (p95) spread across draws
    return number(spread)


def leak_entries(summary: LeakSummary) -> list[LeakEntry]:
    """The run-level entries of a report/summary.json, each of one party (a colluding group's
    entries are not a party's: the comparison reads one party). The one place that knows its layout:
    `flipped`/`raw` (mean, p95, max over batches) for AUC attacks, `accuracy` (mean over batches,
    or `pooled` over rows) for accuracy attacks, and, when present, `spread` across random
    side-knowledge draws (a number, or per part {"flipped": ..., "accuracy": ...}, each per
    statistic {"p95": {"std": ..}}), the threshold accuracy of score attacks, why an attack was
    not applied (`premise`) or is a diagnostic, `count_error` for count attacks, and a run-level
    attack's further figures (FIGURES)."""
    entries = []
    for e in summary.leak:
        if e.scope != "run" or len(e.parties or [e.party_id]) > 1:
            continue  # an epoch's, or a colluding group's (its party_id is its first party's)
        flipped, raw, accuracy = (e.get(k) or {} for k in ("flipped", "raw", "accuracy"))
        metric = e.get("metric") or ("auc" if flipped else "accuracy")
        if metric in RECONSTRUCTION_METRICS:
            accuracy = e.get(metric) or {}
        elif e.get("integrity") is not None:  # a backdoor's success rate, a robustness attack's accuracy drop
            accuracy = {"mean": (e.get("integrity") or {}).get("value")}
        pooled = (e.get("pooled") or {}).get("accuracy", accuracy.get("pooled", e.get("pooled_accuracy")))
        entries.append(LeakEntry(
            attack=e.attack, party=e.party_id, layer=e.layer, metric=metric,
            side_knowledge=e.get("side_knowledge", ""),
            attack_type=FAMILIES.get(e.get("family") or "", e.get("attack_type")) or (
                "feature reconstruction" if metric in RECONSTRUCTION_METRICS
                else DEFAULT_ATTACK_TYPE),
            flipped_mean=number(flipped.get("mean")), flipped_p95=number(flipped.get("p95")),
            raw_mean=number(raw.get("mean")), raw_p95=number(raw.get("p95")),
            accuracy=number(pooled if pooled is not None else accuracy.get("mean")),
            spread=_spread(e, "flipped" if metric == "auc" else "accuracy"),
            threshold_accuracy=number((e.get("threshold_accuracy") or {}).get("mean")),
            threshold_rule=e.get("threshold_rule"),
            premise=e.get("premise") or _refused(e) or _all_skipped(e),
            diagnostic=e.get("diagnostic"), ap=number((e.get("ap") or {}).get("value")),
            vflair=e.get("vflair"), vflair_declared="vflair" in e.as_dict(),
            **_batch_stats(e, metric), figures=_figures(e)))
    return entries


def _refused(entry: LeakSummaryEntry) -> str | None:
    """Why a run-level attack skipped the run (its entry's `error`), else None."""
    error = entry.get("error")
    return str(error) if error and entry.get("skipped") else None


def _all_skipped(entry: LeakSummaryEntry) -> str | None:
    """Why a batch attack has no figure when every batch it met was skipped (one class only,
    rows it cannot tell apart: the run's report.md gives the reasons), else None."""
    batches, skipped = entry.batches or 0, entry.skipped or 0
    if not batches or skipped < batches:
        return None
    degenerate = f", {entry.degenerate} of them degenerate" if entry.degenerate else ""
    return (f"every one of its {batches} batch(es) was skipped{degenerate}: no figure; the run's "
            "report.md says why")


def _batch_stats(entry: LeakSummaryEntry, metric: str) -> dict[str, float | None]:
    stats = entry.get(BATCH_STATS.get(metric, metric)) or {}
    return {"batch_mean": number(stats.get("mean")), "batch_p95": number(stats.get("p95"))}


def _figures(entry: LeakSummaryEntry) -> dict[str, float | None]:
    return {name: number(value) for key, read in FIGURES.items() if isinstance(entry.get(key), dict)
            for name, value in read(entry.get(key)).items()}
