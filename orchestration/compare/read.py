"""What the comparison reads from a run directory: its config, final utility (metrics.jsonl) and
run-level leak (report/summary.json), through one adapter for the summary's entries."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestration.sweep.index import INDEX_FILE, read_index
from splitleak.config import ConfigError, ExperimentConfig, load_config
from splitleak.metrics_log import read_metrics
from splitleak.pace import ms_per_step, utility_curve
from splitleak.rundir import RunDir

DEFAULT_ATTACK_TYPE = "label inference"  # VFLAIR's LI type: every attack on the gradients
# Feature reconstruction (VFLAIR's FR type): the entry's metric names its headline statistic.
RECONSTRUCTION_METRICS = ("ssim", "r2", "feature_accuracy")
# VFLAIR's attack families (its T-DCS types), as each attack plug-in declares its own.
FAMILIES = {"label_inference": "label inference", "feature_reconstruction": "feature reconstruction",
            "targeted_backdoor": "targeted backdoor", "non_targeted": "non-targeted"}


@dataclass(frozen=True)
class LeakEntry:
    """One attack's run-level leak at one party and layer."""

    attack: str
    party: int
    layer: str
    metric: str  # "auc", "accuracy", or a reconstruction's ("ssim", "r2", "feature_accuracy")
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
    premise: str | None = None  # why the attack does not apply to the run (never scored)
    diagnostic: str | None = None  # why the figure is a diagnostic, not the comparable one
    ap: float | None = None  # VFLAIR's attack performance, as the attack's plug-in reads it
    vflair: str | None = None  # VFLAIR's name for the attack (NS, DS, …), if it has one


def _number(value: Any) -> float | None:
    if isinstance(value, dict):  # a spread given per statistic: its standard deviation, else the
        value = value.get("std", value.get("sd", value.get("mean")))  # spread of the mean
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _spread(entry: dict[str, Any], part: str) -> float | None:
    spread = entry.get("spread")
    if isinstance(spread, dict) and part in spread:
        spread = spread[part]
    if isinstance(spread, dict) and isinstance(spread.get("p95"), dict):
        spread = spread["p95"]  # per statistic: the headline's (p95) spread across draws
    return _number(spread)


def leak_entries(summary: dict[str, Any]) -> list[LeakEntry]:
    """The run-level entries of a report/summary.json. The one place that knows its layout:
    `flipped`/`raw` (mean, p95, max over batches) for AUC attacks, `accuracy` (mean over batches,
    or `pooled` over rows) for accuracy attacks, and, when present, `spread` across random
    side-knowledge draws (a number, or per part {"flipped": ..., "accuracy": ...}, each per
    statistic {"p95": {"std": ..}}), the threshold accuracy of score attacks, and why an attack
    was not applied (`premise`) or is a diagnostic. Count attacks (metric count_error: lower =
    more leak) are left out: the comparison ranks leaks that grow with what the attacker learns."""
    entries = []
    for e in summary.get("leak", []):
        if e.get("scope") != "run" or e.get("metric") == "count_error":
            continue
        flipped, raw, accuracy = (e.get(k) or {} for k in ("flipped", "raw", "accuracy"))
        metric = e.get("metric") or ("auc" if flipped else "accuracy")
        if metric in RECONSTRUCTION_METRICS:
            accuracy = e.get(metric) or {}
        elif "integrity" in e:  # a backdoor's success rate, a robustness attack's accuracy drop
            accuracy = {"mean": (e.get("integrity") or {}).get("value")}
        pooled = (e.get("pooled") or {}).get("accuracy", accuracy.get("pooled", e.get("pooled_accuracy")))
        entries.append(LeakEntry(
            attack=e["attack"], party=int(e["party_id"]), layer=e["layer"], metric=metric,
            side_knowledge=e.get("side_knowledge", ""),
            attack_type=FAMILIES.get(e.get("family") or "", e.get("attack_type")) or (
                "feature reconstruction" if metric in RECONSTRUCTION_METRICS
                else DEFAULT_ATTACK_TYPE),
            flipped_mean=_number(flipped.get("mean")), flipped_p95=_number(flipped.get("p95")),
            raw_mean=_number(raw.get("mean")), raw_p95=_number(raw.get("p95")),
            accuracy=_number(pooled if pooled is not None else accuracy.get("mean")),
            spread=_spread(e, "flipped" if metric == "auc" else "accuracy"),
            threshold_accuracy=_number((e.get("threshold_accuracy") or {}).get("mean")),
            threshold_rule=e.get("threshold_rule"), premise=e.get("premise"),
            diagnostic=e.get("diagnostic"), ap=_number((e.get("ap") or {}).get("value")),
            vflair=e.get("vflair")))
    return entries


def utility_metric(num_classes: int) -> str:
    return "test_auc" if num_classes == 2 else "test_accuracy"


@dataclass(frozen=True)
class RunResult:
    """A finished, analysed run as the comparison sees it."""

    root: Path
    config: ExperimentConfig
    label: str | None  # the sweep's name for its setting (None outside a sweep)
    num_classes: int
    final_eval: dict[str, Any]
    leak: list[LeakEntry]
    ms_per_step: float | None = None  # median train step (metrics.jsonl's clock)
    curve: tuple[tuple[float, float], ...] = ()  # (seconds, utility) of each evaluation
    bytes_per_step: float | None = None  # both directions at the label party (outcome.json)

    @property
    def seed(self) -> int:
        return self.config.run.seed

    @property
    def utility_metric(self) -> str:
        return utility_metric(self.num_classes)

    @property
    def utility(self) -> float | None:
        return _number(self.final_eval.get(self.utility_metric))


def read_run(root: Path, label: str | None = None) -> RunResult:
    """Raises ValueError saying what is missing when the run cannot be compared."""
    run = RunDir(root)
    summary_path = run.report / "summary.json"
    for needed, why in ((run.config, "config.toml"), (run.metrics, "label_party/metrics.jsonl"),
                        (summary_path, "report/summary.json (run `attacker analyze` on it)")):
        if not needed.exists():
            raise ValueError(f"{root}: no {why}")
    try:
        config = load_config(run.config)
    except ConfigError as err:
        raise ValueError(f"{root}: {err}") from None
    records = list(read_metrics(run.metrics))
    evals = [r for r in records if r.get("type") == "eval"]
    plan = next((r for r in records if r.get("type") == "plan"), {})
    summary = json.loads(summary_path.read_text())
    num_classes = int(summary.get("num_classes") or plan.get("num_classes") or 2)
    metric = utility_metric(num_classes)
    return RunResult(root, config, label, num_classes, evals[-1] if evals else {},
                     leak_entries(summary), ms_per_step(records),
                     tuple(utility_curve(records, metric)), _bytes_per_step(run, records))


def _bytes_per_step(run: RunDir, records: list[dict[str, Any]]) -> float | None:
    """Bytes the label party sent and received per step, evaluation passes included."""
    try:
        outcome = json.loads(run.outcome.read_text())
    except (OSError, ValueError):
        return None
    steps = sum(1 for r in records if r.get("type") == "train")
    sent, received = outcome.get("bytes_sent"), outcome.get("bytes_received")
    if not steps or not isinstance(sent, int) or not isinstance(received, int):
        return None
    return (sent + received) / steps


def find_runs(paths: list[Path]) -> tuple[list[RunResult], list[str]]:
    """Runs under each path (a sweep directory: its finished points; a run directory; or a
    directory of run directories) and a warning for each one that cannot be compared.
    ValueError when a path is none of these."""
    found: list[tuple[Path, str | None]] = []
    for path in paths:
        if (path / INDEX_FILE).exists():
            found += [(path / row["run_dir"], row["setting"]) for row in read_index(path)
                      if row["status"] == "done"]
        elif (path / "config.toml").exists():
            found.append((path, None))
        elif path.is_dir() and any((child / "config.toml").exists() for child in path.iterdir()):
            found += [(child, None) for child in sorted(path.iterdir())
                      if (child / "config.toml").exists()]
        else:
            raise ValueError(f"{path}: not a sweep directory (no {INDEX_FILE}), a run directory "
                             "(no config.toml) or a directory of run directories")
    runs, warnings = [], []
    for root, label in found:
        try:
            runs.append(read_run(root, label))
        except ValueError as err:
            warnings.append(f"skipped: {err}")
    return runs, warnings
