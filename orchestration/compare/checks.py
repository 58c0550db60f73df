"""What the comparison warns about: too few seeds, no baseline, a utility no better than chance,
attacks whose premise failed, and the attack performance or VFLAIR name a DCS needs but a
summary lacks."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from orchestration.compare import dcs as capability
from orchestration.compare.read import RunResult
from orchestration.compare.stats import PROBABILITY, over_seeds
from splitleak.artifacts.summary import describe_analysed_with

if TYPE_CHECKING:
    from orchestration.compare.table import Setting

UTILITY_WORDS = {"test_auc": "test AUC", "test_accuracy": "test accuracy"}


def setting_warnings(setting: Setting) -> list[str]:
    out = []
    if len(setting.runs) < 3:
        out.append(f"{setting.label}: {len(setting.runs)} seed(s); confidence intervals need at "
                   "least 3 to mean much (ALGORITHMS.md §1)")
    if setting.baseline is None:
        out.append(f"{setting.label}: no run of the same set-up without a defense, so no utility "
                   "drop and no DCS")
    return out + near_chance(setting)


def near_chance(setting: Setting) -> list[str]:
    """A warning when the setting's utility interval holds chance: its model learned nothing
    measurable, so its leak and DCS say little (e.g. a sweep on a 10 % subset at AUC ≈ 0.52)."""
    first = setting.first
    guess = capability.chance("auc" if first.num_classes == 2 else "accuracy", first.num_classes)
    utility = over_seeds([r.utility for r in setting.runs.values()], True, PROBABILITY)
    if utility is None or not utility.ci_low <= guess <= utility.ci_high:
        return []
    return [f"{setting.label}: its {UTILITY_WORDS[first.utility_metric]} {utility.mean:.3f} "
            f"[{utility.ci_low:.3f}, {utility.ci_high:.3f}] is within its interval of chance "
            f"({guess:.3f}): the model learned nothing measurable, so its leak and DCS say little"]


def not_applied(runs: list[RunResult], party: int | None, layer: str) -> dict[str, str]:
    """Attacks whose premise failed in every run that has them (left out of every table)."""
    reasons: dict[str, set[str]] = defaultdict(set)
    scored: set[str] = set()  # attacks with a run whose premise held
    for run in runs:
        for entry in run.leak:
            if entry.party == party and entry.layer == layer:
                if entry.premise is None:
                    scored.add(entry.attack)
                else:
                    reasons[entry.attack].add(entry.premise)
    return {a: next(iter(r)) for a, r in reasons.items() if a not in scored and len(r) == 1}


def premise_failed(settings: list[Setting], party: int | None,
                   layer: str) -> dict[str, dict[str, str]]:
    """Per attack, the settings where its premise failed in every run that has it while other
    settings scored it (attacks failing everywhere: not_applied), with the summary's reason."""
    everywhere = not_applied([r for s in settings for r in s.runs.values()], party, layer)
    failed: dict[str, dict[str, str]] = defaultdict(dict)
    for setting in settings:
        entries = [e for run in setting.runs.values() for e in run.leak
                   if e.party == party and e.layer == layer and e.attack not in everywhere]
        scored = {e.attack for e in entries if e.premise is None}
        for entry in entries:
            if entry.premise is not None and entry.attack not in scored:
                failed[entry.attack].setdefault(setting.label, entry.premise)
    return dict(failed)


def without_leak(runs: list[RunResult]) -> list[str]:
    """Runs whose summary has no leak entry (an analysis that measured nothing): left out."""
    return [f"{run.root}: its report/summary.json has no leak entry (its analysis measured no "
            "attack; re-run `attacker analyze` on it, with its gradient log): left out of every "
            "table and verdict" for run in runs if not run.leak]


def mixed_tasks(runs: list[RunResult]) -> list[str]:
    """Runs whose utilities are different metrics (a binary task's AUC beside a multi-class
    task's accuracy): not one scale."""
    by_metric: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        by_metric[run.utility_metric].add(run.config.dataset.name)
    if len(by_metric) < 2:
        return []
    parts = "; ".join(f"{UTILITY_WORDS.get(m, m)} for {', '.join(sorted(d))}"
                      for m, d in sorted(by_metric.items()))
    return [f"these runs are of different tasks ({parts}): their utilities are not on one scale"]


def analysed_apart(runs: list[RunResult]) -> list[str]:
    """Runs `attacker analyze` was told to analyse otherwise than their configs say (other
    attacks, side knowledge, seed or draws) beside runs analysed another way: their figures
    differ by more than their settings."""
    ways = {json.dumps(run.analysed_with, sort_keys=True) for run in runs}
    if len(ways) < 2:
        return []
    return [f"{run.root.name}: re-analysed with {describe_analysed_with(run.analysed_with)}, "
            "unlike other runs compared here, so its figures differ from theirs by more than its setting; "
            f"`attacker analyze {run.root}` analyses it as its config says"
            for run in runs if run.analysed_with]


def some_seeds(rows: list[dict[str, Any]], settings: list[Setting]) -> list[str]:
    """Attacks measured in only some of a setting's runs (one re-analysed with other attacks):
    their figures are over fewer seeds than the setting's utility."""
    runs = {s.label: s.runs for s in settings}
    out = []
    for row in rows:
        seeds = set(json.loads(row["seeds"]))
        lacking = sorted(set(runs[row["setting"]]) - seeds)
        if lacking:
            names = ", ".join(runs[row["setting"]][s].root.name for s in lacking)
            out.append(f"{row['setting']}: {row['attack']} is measured in {len(seeds)} of its "
                       f"{len(runs[row['setting']])} seeds' runs; its summaries lack it in "
                       f"{names} (seed {', '.join(map(str, lacking))})")
    return out


def unpaired_seeds(settings: list[Setting]) -> list[str]:
    """Seeds of a defended setting its no-defense baseline lacks: its utility drop and DCS are
    paired by seed, so they are over fewer seeds than its utility."""
    out = []
    for setting in settings:
        if setting.baseline is None or setting.baseline is setting:
            continue
        lacking = sorted(set(setting.runs) - set(setting.baseline.runs))
        if lacking:
            out.append(f"{setting.label}: its no-defense baseline ({setting.baseline.label}) lacks "
                       f"seed {', '.join(map(str, lacking))}, so its utility drop and DCS are over "
                       f"the {len(setting.runs) - len(lacking)} paired seed(s), its utility over "
                       f"all {len(setting.runs)}")
    return out


def missing_ap(rows: list[dict[str, Any]], dcs_ap: str) -> list[str]:
    """Attacks measured but without the AP the DCS needs (summaries analysed before the
    threshold accuracy existed)."""
    missing = dict.fromkeys(r["attack"] for r in rows if r["leak_mean"] is not None
                            and r["ap_mean"] is None and r["baseline"] is not None)
    return [f"{attack}: no {dcs_ap} attack performance in these runs' summaries (analysed before "
            "splitleak recorded it?): no DCS; re-run `attacker analyze`, or --dcs-ap auc"
            for attack in missing]


def undeclared_vflair(runs: list[RunResult]) -> list[str]:
    """Attacks whose summaries predate the VFLAIR name each plug-in declares: T-DCS cannot tell
    whether VFLAIR has them, so they are left out of it."""
    undeclared = dict.fromkeys(e.attack for run in runs for e in run.leak if not e.vflair_declared)
    return [f"{attack}: these runs' summaries do not say whether VFLAIR has this attack (analysed "
            "before each attack named its VFLAIR counterpart): left out of T-DCS and C-DCS; re-run "
            "`attacker analyze`" for attack in undeclared]
