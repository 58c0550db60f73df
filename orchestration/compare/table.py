"""The comparison table: one row per (setting, attack), every number over the setting's seeds.

A setting is what the sweep named one (its variant and axis values, across its seeds), or for
runs outside a sweep a config without its seed (orchestration.compare.identity); its baseline
is the setting of the same set-up (same config without defense, objective,
[protection], [network], [wire] and [attacker]) that has no defense (no gradient defense, or only
`no_noise`, the plain cross_entropy objective, no input protection and a float32 wire: a
narrower wire rounds what the passive party sees, so it counts as a defense). A run is paired
with the baseline run of the same seed.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from statistics import fmean
from typing import Any

from orchestration.compare import checks
from orchestration.compare import dcs as capability
from orchestration.compare.entries import LeakEntry
from orchestration.compare.identity import identify, setup_key, telling_apart
from orchestration.compare.read import RunResult
from orchestration.compare.stats import PROBABILITY, UNBOUNDED, over_seeds
from orchestration.compare.verdict import MAX_UTILITY_COST, Verdict, verdicts
from splitleak.pace import time_to

AUC_STATS = ("flipped_mean", "flipped_p95", "raw_mean", "raw_p95")
# batch_*: the per-batch metric (flip-corrected AUC, accuracy, count error) over batches
LEAK_STATS = (*AUC_STATS, "accuracy", "batch_mean", "batch_p95")
NON_NEGATIVE = (0.0, math.inf)  # times
METRIC_RANGES = {"accuracy": PROBABILITY, "feature_accuracy": PROBABILITY, "ssim": (-1.0, 1.0),
                 "r2": (-math.inf, 1.0), "count_error": PROBABILITY}
# Metrics that fall as the attacker learns more: shown with their change against no defense,
# on no Pareto frontier and with no verdict (both rank leaks that grow); their DCS comes from
# their attack performance, which grows (a count attack's: 1 − count error, VFLAIR's BLI).
LEAK_FALLS_AS_IT_RISES = ("count_error",)  # metrics where a higher figure is less leak
UNRANKED = {"count_error": "a count error falls as the attacker learns more; its attack "
                            "performance, for the DCS, is 1 − count error (VFLAIR's BLI)"}


@dataclass
class Setting:
    key: str
    setup: str
    label: str
    family: str
    strengths: dict[str, float]
    runs: dict[int, RunResult]  # by seed
    defenseless: bool = False  # no defense in its config: its set-up's baseline
    overrides: dict[str, Any] | None = None  # what its sweep set (None outside a sweep)
    baseline: Setting | None = None

    @property
    def first(self) -> RunResult:
        return next(iter(self.runs.values()))


def settings_of(runs: list[RunResult], warnings: list[str]) -> list[Setting]:
    """Runs grouped by setting (first-seen order), each paired with its set-up's baseline."""
    settings: dict[str, Setting] = {}
    for run in runs:
        identity = identify(run.config, run.point)
        setting = settings.get(identity.key)
        if setting is None:
            setting = settings[identity.key] = Setting(
                identity.key, setup_key(run.config), identity.label, identity.family,
                identity.strengths, {}, identity.defenseless, identity.overrides)
        if run.seed in setting.runs:
            warnings.append(f"{setting.label}: seed {run.seed} twice ({setting.runs[run.seed].root} "
                            f"and {run.root}); the second is left out")
            continue
        setting.runs[run.seed] = run
    _tell_apart(list(settings.values()), warnings)
    baselines: dict[str, Setting] = {}
    for setting in settings.values():
        if setting.defenseless:
            baselines.setdefault(setting.setup, setting)
    for setting in settings.values():
        setting.baseline = baselines.get(setting.setup)
    return list(settings.values())


def _tell_apart(settings: list[Setting], warnings: list[str]) -> None:
    """Settings of one name (two `no defense`, one with a malicious party) get their key as a
    suffix (`no defense [3f9a1c]`), and a warning says what differs in their configs."""
    named: dict[str, list[Setting]] = defaultdict(list)
    for setting in settings:
        named[setting.label].append(setting)
    for label, same in named.items():
        if len(same) < 2:
            continue
        for setting in same:
            setting.label = f"{label} [{setting.key[:6]}]"
        told = telling_apart([s.first.config for s in same])
        what = ("; ".join(f"[{s.key[:6]}] {apart}" for s, apart in zip(same, told, strict=True))
                if told is not None else "their configs are the same (one config in several sweeps)")
        warnings.append(f"{len(same)} settings are named {label!r}, told apart by a suffix: {what}")


def observed_party(settings: list[Setting], layer: str, asked: int | None = None) -> int | None:
    """The party compared at `layer`: `asked` (--party) where the runs measured it there, else
    the lowest that was."""
    parties = {e.party for s in settings for r in s.runs.values() for e in r.leak if e.layer == layer}
    return asked if asked in parties else min(parties) if parties else None


@dataclass
class Comparison:
    rows: list[dict[str, Any]]
    settings: list[Setting]
    party: int | None
    layer: str
    leak_stat: str  # the AUC statistic plots and the frontier use
    warnings: list[str] = field(default_factory=list)
    speed: dict[str, dict[str, Any]] = field(default_factory=dict)  # by setting key
    speed_target: float | None = None  # the utility "time to target" is measured to
    speed_target_is_common: bool = True  # the lowest final utility of any run (all reach it)
    dcs_ap: str = "vflair"  # the attack performance DCS is computed from (dcs.ATTACK_PERFORMANCE)
    max_utility_cost: float = MAX_UTILITY_COST  # the verdicts' budget
    not_applied: dict[str, str] = field(default_factory=dict)  # attack -> why its premise failed
    # attack -> {setting: why its premise failed there}: no verdict for the attack
    premise_failed: dict[str, dict[str, str]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # runs whose summaries have no leak entry
    # VFLAIR's capability over every family: DCS rows of each attack where it is measured (the
    # cut layer, model completion's bottom, reconstruction's input, integrity's output), with
    # T-DCS per family over VFLAIR's own attacks and C-DCS over the families that have one (the
    # DCS section of the report)
    capability: list[dict[str, Any]] = field(default_factory=list)

    def about_speed(self) -> bool:
        """True when the settings differ in how tensors travel ([network] or [wire])."""
        ways = {(s.first.config.network, s.first.config.wire) for s in self.settings}
        return len(ways) > 1 or any(net.shaped for net, _ in ways)

    def attacks(self) -> list[str]:
        """Every attack compared, the diagnostics last."""
        found = {r["attack"]: bool(r["diagnostic"]) for r in self.rows}
        return sorted(found, key=lambda a: found[a])  # stable: first-seen order otherwise

    def verdicts(self) -> list[Verdict]:
        return verdicts(self.rows, self.attacks(), self.max_utility_cost, self.premise_failed)

    def left_out_line(self) -> list[str]:
        """The runs no verdict counts (their summaries have no leak entry), said under the verdicts."""
        return [f"Not in any verdict, as their summaries have no leak entry: "
                f"{', '.join(self.left_out)}"] if self.left_out else []


# Where each family's attacks are measured, once each (the first layer repeats the cut layer's
# label inference; activations are a diagnostic of the same attacks).
CAPABILITY_LAYERS = ("cut", "bottom", "input", "output")


def headline(metric: str, leak_stat: str) -> str:
    """The statistic a row's leak is: `leak_stat` of an AUC, a count attack's mean count error,
    else the accuracy (pooled over rows where the summary has it) or a reconstruction's."""
    return {"auc": leak_stat, "count_error": "batch_mean"}.get(metric, "accuracy")


def compare(runs: list[RunResult], layer: str = "cut", party: int | None = None,
            leak_stat: str = "flipped_p95", warnings: list[str] | None = None,
            target: float | None = None, dcs_ap: str = "vflair",
            max_utility_cost: float = MAX_UTILITY_COST) -> Comparison:
    warnings = warnings if warnings is not None else []
    warnings += checks.without_leak(runs)
    left_out = [str(run.root) for run in runs if not run.leak]
    runs = [run for run in runs if run.leak]
    warnings += checks.analysed_apart(runs) + checks.mixed_tasks(runs)
    settings = settings_of(runs, warnings)
    party = party if party is not None else observed_party(settings, layer)
    rows: list[dict[str, Any]] = []
    for setting in settings:
        warnings += checks.setting_warnings(setting)
        rows += _setting_rows(setting, party, layer, leak_stat, dcs_ap)
    if not rows:
        elsewhere = sorted({e.layer for r in runs for e in r.leak} - {layer})
        warnings.append(f"no leak at the {layer} layer in these runs" + (
            f"; they have {', '.join(elsewhere)} (--layer)" if elsewhere else ""))
    not_applied = checks.not_applied(runs, party, layer)
    warnings += [f"{attack}: not scored, its premise fails in these runs: {why}"
                 for attack, why in not_applied.items()]
    premise_failed = checks.premise_failed(settings, party, layer)
    warnings += [f"{attack}: not scored for {setting}, its premise fails in its runs: {why}; no "
                 "verdict for this attack" for attack, failed in premise_failed.items()
                 for setting, why in failed.items()]
    warnings += _skipped_elsewhere(runs, settings, party, layer)
    warnings += checks.missing_ap(rows, dcs_ap) + checks.undeclared_vflair(runs)
    warnings += checks.some_seeds(rows, settings)
    warnings += checks.unpaired_seeds(settings)
    _mark_frontier(rows)
    _add_type_scores(rows, settings)
    capability = [r for where in CAPABILITY_LAYERS for setting in settings
                  for r in _setting_rows(setting, observed_party(settings, where, party), where,
                                         leak_stat, dcs_ap)]
    _add_type_scores(capability, settings)
    _same_type_scores(rows, capability)
    finals = [r.utility for r in runs if r.utility is not None]
    common = target is None
    target = min(finals) if common and finals else target
    speed = {s.key: _speed(s, target) for s in settings}
    return Comparison(rows, settings, party, layer, leak_stat, warnings, speed, target, common,
                      dcs_ap, max_utility_cost, not_applied, premise_failed, left_out, capability)


TYPE_SCORES = [f"{name}_{k}" for name in ("t_dcs", "c_dcs", "t_dcs_ours", "c_dcs_ours")
               for k in ("mean", "ci_low", "ci_high", "worst", "best", "ci_clipped")] + [
    "t_dcs_of_means", "c_dcs_of_means"]


def _same_type_scores(rows: list[dict[str, Any]], capability: list[dict[str, Any]]) -> None:
    """The compared rows' T-DCS and C-DCS as the capability rows have them (over every
    CAPABILITY_LAYERS layer measured, report.md's Defense capability), not over the compared
    layer's attacks alone; a row of another layer (first, activation: diagnostics of the same
    attacks) carries its attack's, measured at the first of those layers that has it."""
    found = {(r["setting_key"], r["attack"], r["layer"]): r for r in capability}
    for r in capability:
        found.setdefault((r["setting_key"], r["attack"], None), r)
    for row in rows:
        same = found.get((row["setting_key"], row["attack"], row["layer"]))
        if same is None and row["layer"] not in CAPABILITY_LAYERS:
            same = found.get((row["setting_key"], row["attack"], None))
        if same is not None:
            row |= {name: same[name] for name in TYPE_SCORES}


def _skipped_elsewhere(runs: list[RunResult], settings: list[Setting], party: int | None,
                       layer: str) -> list[str]:
    """Why an attack measured at another layer than `layer` (model completion's bottom, a
    reconstruction's input, ...) was not scored, where the report's capability section and DCS
    would otherwise leave it out unsaid."""
    out = []
    for where in CAPABILITY_LAYERS:
        if where == layer:
            continue
        at = observed_party(settings, where, party)
        out += [f"{attack} (party {at}, {where} layer): not scored, skipped in these runs: {why}"
                for attack, why in checks.not_applied(runs, at, where).items()]
        out += [f"{attack} (party {at}, {where} layer): not scored for {setting}, skipped in its "
                f"runs: {why}" for attack, failed in checks.premise_failed(settings, at, where).items()
                for setting, why in failed.items()]
    return out


def _speed(setting: Setting, target: float | None) -> dict[str, Any]:
    """A setting's ms per step, seconds to `target` and bytes per step over its seeds."""
    runs = list(setting.runs.values())
    reach = [time_to(list(r.curve), target) if target is not None else None for r in runs]
    sizes = [r.bytes_per_step for r in runs if r.bytes_per_step is not None]
    return {**_columns("ms_per_step", [r.ms_per_step for r in runs], False, NON_NEGATIVE),
            **_columns("seconds_to_target", reach, False, NON_NEGATIVE),
            **_columns("utility", [r.utility for r in runs], True, PROBABILITY),
            "kib_per_step": fmean(sizes) / 1024 if sizes else None,
            "reached": sum(t is not None for t in reach), "runs": len(runs)}


def _entries(run: RunResult, party: int | None, layer: str) -> dict[str, LeakEntry]:
    """The run's scored entries at (party, layer): an attack whose premise failed is left out."""
    return {e.attack: e for e in run.leak if e.party == party and e.layer == layer
            and e.premise is None}


def _stat(entry: LeakEntry | None, stat: str) -> float | None:
    return None if entry is None else getattr(entry, stat)


def _figure(entry: LeakEntry, name: str) -> float | None:
    return entry.figures.get(name)


def _per_seed_dcs(setting: Setting, attack: str, party: int | None, layer: str,
                  ap_star: float | None, dcs_ap: str) -> dict[int, float]:
    """DCS per seed against the same seed's baseline utility; AP* = 0, or chance when given."""
    out = {}
    baseline = setting.baseline
    for seed, run in setting.runs.items():
        base = baseline.runs.get(seed) if baseline is not None else None
        ap = capability.attack_performance(_entries(run, party, layer).get(attack), dcs_ap)
        if base is None or ap is None or run.utility is None or base.utility is None:
            continue
        out[seed] = capability.dcs(ap, run.utility, base.utility, ap_star or 0.0)
    return out


def _setting_rows(setting: Setting, party: int | None, layer: str, leak_stat: str,
                  dcs_ap: str) -> list[dict[str, Any]]:
    per_seed = {seed: _entries(run, party, layer) for seed, run in setting.runs.items()}
    attacks = list(dict.fromkeys(a for entries in per_seed.values() for a in entries))
    first = setting.first
    utility = {seed: run.utility for seed, run in setting.runs.items()}
    base_runs = setting.baseline.runs if setting.baseline else {}
    paired = [(base, u) for s, u in utility.items()
              if s in base_runs and u is not None and (base := base_runs[s].utility) is not None]
    drops = [base - u for base, u in paired]
    relative = [(base - u) / base for base, u in paired if base]  # Luo & Zhang's ADR
    rows = []
    for attack in attacks:
        entries = {seed: e[attack] for seed, e in per_seed.items() if attack in e}
        sample = next(iter(entries.values()))
        row: dict[str, Any] = {
            "setting": setting.label, "setting_key": setting.key, "setup": setting.setup,
            "family": setting.family,
            "strengths": json.dumps(setting.strengths), "baseline": setting.baseline.label
            if setting.baseline else None, "attack": attack, "attack_type": sample.attack_type,
            "metric": sample.metric, "side_knowledge": sample.side_knowledge, "party": party,
            "layer": layer, "seeds": json.dumps(sorted(entries)), "n_seeds": len(entries),
            "utility_metric": first.utility_metric, "headline": headline(sample.metric, leak_stat),
            "diagnostic": sample.diagnostic, "ranked": sample.metric not in UNRANKED,
            "vflair": sample.vflair, "in_t_dcs": sample.in_vflair and not sample.diagnostic,
            "threshold_rule": sample.threshold_rule, "dcs_ap": dcs_ap}
        row |= _columns("utility", list(utility.values()), True, PROBABILITY)  # every seed's
        row |= _columns("utility_drop", drops, False, (-1.0, 1.0))
        row |= _columns("relative_drop", relative, False, (-math.inf, 1.0))
        # worst = the most leak: the highest figure, but the lowest count error
        less_leak_higher = sample.metric in LEAK_FALLS_AS_IT_RISES
        for stat in LEAK_STATS:
            bounds = leak_range(sample.metric, stat)
            row |= _columns(f"leak_{stat}", [_stat(e, stat) for e in entries.values()],
                            less_leak_higher, bounds)
        row |= _columns("leak", [_stat(e, row["headline"]) for e in entries.values()],
                        less_leak_higher, leak_range(sample.metric, row["headline"]))
        row |= _columns("leak_change", _changes(setting, attack, party, layer,
                                                partial(_stat, stat=row["headline"])),
                        less_leak_higher)
        row["figures"] = json.dumps(_figures(setting, entries, attack, party, layer))
        row |= _columns("ap", [capability.attack_performance(e, dcs_ap) for e in entries.values()],
                        False, PROBABILITY if sample.metric in ("auc", "accuracy") else UNBOUNDED)
        spreads = [e.spread for e in entries.values() if e.spread is not None]
        row["spread_mean"] = sum(spreads) / len(spreads) if spreads else None
        chance = capability.chance(sample.metric, first.num_classes)
        for name, ap_star in (("dcs", None), ("dcs_ours", chance)):
            values = _per_seed_dcs(setting, attack, party, layer, ap_star, dcs_ap)
            row |= _columns(name, list(values.values()), True, PROBABILITY)
            row[f"{name}_by_seed"] = json.dumps(values)
        row["dcs_of_means"] = _dcs_of_means(setting, entries, utility, dcs_ap)
        rows.append(row)
    return rows


def _changes(setting: Setting, attack: str, party: int | None, layer: str,
             value: Callable[[LeakEntry], float | None]) -> list[float]:
    """Per seed, the relative change of `value` against the same seed's run without a defense."""
    base_runs = setting.baseline.runs if setting.baseline else {}
    out = []
    for seed, run in setting.runs.items():
        pair = (run, base_runs.get(seed))
        ours, theirs = (_entries(r, party, layer).get(attack) if r else None for r in pair)
        if ours is None or theirs is None:
            continue
        now, before = value(ours), value(theirs)
        if now is not None and before:
            out.append((now - before) / before)
    return out


def _figures(setting: Setting, entries: dict[int, LeakEntry], attack: str, party: int | None,
             layer: str) -> dict[str, dict[str, Any]]:
    """A run-level attack's further figures (model completion's test top-1, its baselines): each
    over seeds (each a top-1 accuracy: its interval clipped to [0, 1]), with its relative change
    against no defense where both runs have it."""
    names = dict.fromkeys(name for e in entries.values() for name in e.figures)
    out = {}
    for name in names:
        values = _columns("value", [e.figures.get(name) for e in entries.values()], False,
                          PROBABILITY)
        change = _columns("change", _changes(setting, attack, party, layer,
                                             partial(_figure, name=name)), False)
        out[name] = values | change
    return out


def leak_range(metric: str, stat: str) -> tuple[float, float]:
    """Where a leak statistic lives: a flip-corrected AUC in [0.5, 1], a raw AUC or an accuracy
    in [0, 1], SSIM in [−1, 1], R² at most 1."""
    if stat.startswith("flipped") or (stat.startswith("batch") and metric == "auc"):
        return (0.5, 1.0)
    if metric == "auc" or stat.startswith("raw"):
        return PROBABILITY
    return METRIC_RANGES.get(metric, UNBOUNDED)


def _columns(prefix: str, values: Sequence[float | None], higher_is_better: bool,
             bounds: tuple[float, float] = UNBOUNDED) -> dict[str, Any]:
    summary = over_seeds(values, higher_is_better, bounds)
    if summary is None:
        return {f"{prefix}_{k}": None for k in ("mean", "ci_low", "ci_high", "worst", "best",
                                                "ci_clipped")}
    return summary.columns(prefix)


def _dcs_of_means(setting: Setting, entries: dict[int, LeakEntry],
                  utility: dict[int, float | None], dcs_ap: str) -> float | None:
    """VFLAIR's aggregation: DCS of the seed means (AP, MP) against the baseline's mean MP, over
    the seeds both have (those the per-seed DCS is over)."""
    base = setting.baseline.runs if setting.baseline else {}
    paired = [s for s in entries if s in base]  # the seeds the per-seed DCS is over
    aps = _complete([capability.attack_performance(entries[s], dcs_ap) for s in paired])
    mps = _complete([utility[s] for s in paired])
    stars = _complete([base[s].utility for s in paired])
    if not paired or aps is None or mps is None or stars is None:
        return None
    return capability.dcs(fmean(aps), fmean(mps), fmean(stars))


def _complete(values: list[float | None]) -> list[float] | None:
    """`values` if none is missing, else None."""
    present = [v for v in values if v is not None]
    return present if len(present) == len(values) else None


def _mark_frontier(rows: list[dict[str, Any]]) -> None:
    """Pareto per attack: no other setting has at least the utility and at most the leak
    (seed means), and is strictly better in one of them."""
    by_attack: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_attack[row["attack"]].append(row)
    for group in by_attack.values():
        for row in group:
            u, leak = row["utility_mean"], row["leak_mean"]
            row["pareto"] = row["ranked"] and u is not None and leak is not None and not any(
                o is not row and o["utility_mean"] is not None and o["leak_mean"] is not None
                and o["utility_mean"] >= u and o["leak_mean"] <= leak
                and (o["utility_mean"] > u or o["leak_mean"] < leak) for o in group)


def _add_type_scores(rows: list[dict[str, Any]], settings: list[Setting]) -> None:
    """T-DCS (mean DCS over one type's attacks) and C-DCS (mean of the T-DCS), per seed, then
    over seeds; the `_of_means` columns aggregate VFLAIR's way (from the DCS of seed means).
    VFLAIR's way throughout: over the attacks VFLAIR has (`in_t_dcs`: the entry names VFLAIR's
    counterpart, LeakEntry.in_vflair), ours (AP* = chance) over the same ones. Diagnostics and
    attacks VFLAIR lacks are left out (their columns stay empty); a family with none of VFLAIR's
    attacks in a setting has no T-DCS there and no part in its C-DCS."""
    for row in rows:
        for name in ("t_dcs", "c_dcs", "t_dcs_ours", "c_dcs_ours"):
            row |= _columns(name, [], True)
        row["t_dcs_of_means"] = row["c_dcs_of_means"] = None
    for setting in settings:
        own = [r for r in rows if r["setting_key"] == setting.key and r["in_t_dcs"]]
        types = list(dict.fromkeys(r["attack_type"] for r in own))
        for name in ("dcs", "dcs_ours"):
            per_type: dict[str, dict[int, float]] = {}
            for kind in types:
                by_seed: dict[int, list[float]] = defaultdict(list)
                for r in own:
                    if r["attack_type"] == kind:
                        for seed, value in json.loads(r[f"{name}_by_seed"]).items():
                            by_seed[int(seed)].append(value)
                per_type[kind] = {s: sum(v) / len(v) for s, v in by_seed.items()}
            seeds = set().union(*(v.keys() for v in per_type.values())) if per_type else set()
            c_scores = [capability.mean_of(per_type[k].get(s) for k in types) for s in sorted(seeds)]
            for r in own:
                r |= _columns(f"t_{name}", list(per_type[r["attack_type"]].values()), True, PROBABILITY)
                r |= _columns(f"c_{name}", c_scores, True, PROBABILITY)
        t_means = {kind: capability.mean_of(r["dcs_of_means"] for r in own if r["attack_type"] == kind)
                   for kind in types}
        for r in own:
            r["t_dcs_of_means"] = t_means[r["attack_type"]]
            r["c_dcs_of_means"] = capability.mean_of(t_means.values())
