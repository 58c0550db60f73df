"""compare/: table.parquet and table.csv (one row per setting and attack), the PNGs, report.md."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from orchestration.compare.attack_section import attack_md
from orchestration.compare.dcs import AP_WORDS
from orchestration.compare.entries import FAMILIES
from orchestration.compare.markdown import CLIPPED, LEAK_LABELS, UTILITY_LABELS, ci, md_table, num
from orchestration.compare.table import Comparison, Setting
from orchestration.compare.trends import Trend, trends
from splitleak.artifacts.paths import CompareDir
from splitleak.fileio import write_atomically

log = logging.getLogger("compare")
REPORT_TITLE = "# Trade-off report"  # report.md's first line: what tells compare's own report


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower() or "x"


def write_tables(comparison: Comparison, out: Path) -> None:
    table = pa.Table.from_pylist(comparison.rows)
    written = CompareDir(out)
    write_atomically(written.table_parquet, lambda tmp: pq.write_table(table, tmp))
    write_atomically(written.table_csv, lambda tmp: pa_csv.write_csv(table, tmp))


def _speed_md(comparison: Comparison) -> list[str]:
    target = comparison.speed_target
    utility = UTILITY_LABELS.get(comparison.rows[0]["utility_metric"], "utility") \
        if comparison.rows else "utility"
    body = []
    for setting in comparison.settings:
        speed = comparison.speed[setting.key]
        cfg = setting.first.config
        body.append([setting.label, setting.first.network(), cfg.wire.describe(),
                     ci(speed, "ms_per_step"), ci(speed, "seconds_to_target") + (
                         f" ({speed['reached']} of {speed['runs']} runs reached it)"
                         if speed["reached"] < speed["runs"] else ""),
                     num(speed["kib_per_step"], 1), ci(speed, "utility")])
    reached = "every run reached" if comparison.speed_target_is_common else "asked for"
    return ["## Speed", "",
            "Per setting, over its seeds: the median train step (label party's clock, evaluation "
            f"passes left out), the seconds until the first evaluation at or above {utility} "
            f"{num(target, 4)} (the utility {reached}), and the KiB of protobuf messages the label "
            "party sent and received per train step (evaluation traffic included; before gRPC "
            "compression, which `[wire] compression` applies on the socket; – where the runs record "
            "no bytes: a run trained in-process, as the sweep's inprocess engine trains, exchanges "
            "no messages). Time to the target needs "
            "`training.eval_interval` > 0 for more than the last point.", "",
            *md_table(["setting", "network", "wire", "ms / step [CI]",
                        "s to target [CI]", "KiB / step", f"{utility} [CI]"], body)]


def _outside_t_dcs(capability: list[dict[str, Any]], types: list[str]) -> list[str]:
    """The attacks measured but not averaged into T-DCS because VFLAIR lacks them, and each
    setting's family left without a T-DCS for that reason."""
    outside = [r for r in capability if not r["diagnostic"] and not r["in_t_dcs"]]
    if not outside:
        return []
    names = dict.fromkeys(f"`{r['attack']}` ({r['attack_type']})" for r in outside)
    lines = [f"Left out of T-DCS and C-DCS, as their entries name no VFLAIR counterpart (their "
             f"DCS is in their own section): {', '.join(names)}.", ""]
    for setting in dict.fromkeys(r["setting"] for r in capability):
        own = [r for r in capability if r["setting"] == setting and not r["diagnostic"]]
        for kind in dict.fromkeys(r["attack_type"] for r in own):
            of_kind = [r for r in own if r["attack_type"] == kind]
            if not any(r["in_t_dcs"] for r in of_kind):
                attacks = ", ".join(dict.fromkeys(f"`{r['attack']}`" for r in of_kind))
                where = "its" if kind in types else "the"
                lines.append(f"- {setting}: no T-DCS {kind}, {where} only {kind} attacks "
                             f"({attacks}) name no VFLAIR counterpart")
    return lines + [""] if lines[-1] else lines


def _dcs_md(comparison: Comparison) -> list[str]:
    by_setting: dict[str, list[dict[str, Any]]] = defaultdict(list)
    scored = [r for r in comparison.capability if r["in_t_dcs"]]
    for row in comparison.capability:
        if not row["diagnostic"]:
            by_setting[row["setting"]].append(row)
    types = list(dict.fromkeys(r["attack_type"] for r in scored))
    missing = [f for f in FAMILIES.values() if f not in types]
    header = ["setting", *(f"T-DCS {t} [CI]" for t in types), "C-DCS [CI]", "C-DCS of seed means",
              "C-DCS ours [CI]"]
    body = []
    for setting, rows in by_setting.items():
        own = [r for r in rows if r["in_t_dcs"]]
        t_cells = []
        for kind in types:
            first = next((r for r in own if r["attack_type"] == kind), None)
            t_cells.append(ci(first, "t_dcs") if first else "–")
        body.append([setting, *t_cells, *([ci(own[0], "c_dcs"), num(own[0]["c_dcs_of_means"]),
                                           ci(own[0], "c_dcs_ours")] if own else ["–"] * 3)])
    rules: dict[str, dict[str, None]] = defaultdict(dict)  # rule -> its attacks, in order
    for r in comparison.capability:
        if r.get("threshold_rule"):
            rules[r["threshold_rule"]][f"`{r['attack']}`"] = None
    diagnostics = dict.fromkeys(r["attack"] for r in comparison.capability if r["diagnostic"])
    where = dict.fromkeys(f"party {r['party']} at the {r['layer']} layer" for r in scored)
    return ["## Defense capability (VFLAIR's DCS)", "",
            f"Measured at {', '.join(where) or 'no layer'}.", "",
            "DCS = 1 / (1 + √((1−β)·max(AP−AP*, 0)² + β·max(MP*−MP, 0)²)), β = 0.5, AP* = 0, MP* = the "
            "utility of the same set-up without a defense and the same seed, MP = the utility above; "
            f"AP ({comparison.dcs_ap}, `--dcs-ap`) = {AP_WORDS[comparison.dcs_ap]}. Computed per "
            "seed, then the mean with a 95 % t interval. T-DCS = mean DCS over the attacks of one of "
            "VFLAIR's families that VFLAIR itself has (those whose summary entry names VFLAIR's "
            "counterpart), C-DCS = mean of the T-DCS: here over "
            f"{', '.join(types) or 'no family'}" + (
                f" (no {', '.join(missing)} attack of VFLAIR's in these runs, so this C-DCS is not "
                "VFLAIR's over all four)" if missing else "") +
            ". *Of seed means* = VFLAIR's own aggregation (DCS of the seeds' "
            "mean AP and MP). *Ours*: the same attacks and families, with AP* = chance (0.5 for an "
            "AUC or a binary accuracy, 1/K for a K-class accuracy). An attack whose premise fails in "
            "a run is never scored and not in T-DCS" + (
                f"; diagnostics are left out too ({', '.join(f'`{d}`' for d in diagnostics)})"
                if diagnostics else "") + ".", "",
            *_outside_t_dcs(comparison.capability, types),
            *(["Threshold rules of the score attacks (AP = the rule's accuracy over a batch's scored "
               "rows, side-knowledge rows left out, then the mean over every batch):", "",
               *(f"- {rule}: {', '.join(names)}" for rule, names in rules.items()), ""]
              if rules and comparison.dcs_ap == "vflair" else []),
            *md_table(header, body)]


def _verdict_md(comparison: Comparison) -> list[str]:
    """The report opens with what to pick, per attack."""
    found = comparison.verdicts()
    if not found:
        return []
    return ["## Verdict", "",
            f"Per attack, the setting on the Pareto frontier with the lowest leak among those whose "
            f"mean utility drop against no defense (paired by seed) is at most "
            f"{comparison.max_utility_cost:g} (`--max-utility-cost`; 0.01 = 0.01 of test AUC or 1 point "
            "of test accuracy). Leak = the frontier's statistic below; see Warnings for settings whose "
            "utility is within its interval of chance.", "",
            *(f"- {v.sentence()}" for v in found), *(["", *comparison.left_out_line()]
                                                      if comparison.left_out else []), ""]


def _trend_md(found: list[Trend], figures: dict[str, str]) -> list[str]:
    if not found:
        return []
    body = []
    for t in found:
        levels = "; ".join(f"{v:g}: {ci(row, 'leak')}" for v, row in t.levels)
        held = ", ".join(f"{k}={v:g}" for k, v in t.fixed.items()) or "–"
        body.append([t.family, t.parameter, held, t.attack, levels, t.direction,
                     num(t.spearman, 2)])
    return ["## Leak vs strength", "",
            "Seed-mean leak (95 % t interval) at each level of a parameter within a defense family; "
            "direction = whether the mean leak is monotone in the parameter (count attacks: a count "
            "error that rises is a leak that falls).", "",
            *md_table(["family", "parameter", "held", "attack", "leak at each level", "direction",
                        "Spearman ρ"], body),
            *(f"![{family}: leak vs strength]({name})\n" for family, name in figures.items())]


def _draw(comparison: Comparison, out: Path, found: list[Trend], warnings: list[str]) -> tuple[
        dict[str, str], dict[str, str]]:
    from orchestration.compare import plots  # matplotlib only when a report is written

    by_attack: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in comparison.rows:
        by_attack[row["attack"]].append(row)
    attack_figures, family_figures = {}, {}
    for attack, rows in by_attack.items():
        if not rows[0]["ranked"]:  # no frontier to draw: its leak falls as the attacker learns
            continue
        name = f"leak_vs_utility_{_slug(attack)}.png"
        try:
            plots.leak_vs_utility(rows, out / name, LEAK_LABELS[rows[0]["headline"]],
                                  UTILITY_LABELS.get(rows[0]["utility_metric"], "utility"))
            attack_figures[attack] = name
        except Exception as err:  # noqa: BLE001 - a broken plot must not lose the report
            log.exception("plot %s failed", name)
            warnings.append(f"plot {name} failed: {type(err).__name__}: {err}")
    by_family: dict[str, list[Trend]] = defaultdict(list)
    for trend in found:
        by_family[trend.family].append(trend)
    for family, family_trends in by_family.items():
        name = f"strength_{_slug(family)}.png"
        baseline = family_trends[0].levels[0][1]["baseline"]
        baselines = {r["attack"]: r for r in comparison.rows if r["setting"] == baseline}
        leak_label = LEAK_LABELS[family_trends[0].levels[0][1]["headline"]]
        try:
            plots.leak_vs_strength(family_trends, baselines, out / name, leak_label)
            family_figures[family] = name
        except Exception as err:  # noqa: BLE001
            log.exception("plot %s failed", name)
            warnings.append(f"plot {name} failed: {type(err).__name__}: {err}")
    return attack_figures, family_figures


def _settings_md(settings: list[Setting]) -> list[str]:
    """Each setting's family and strengths (as its sweep named them), seeds and runs, and for
    a sweep's settings the overrides (its index's) that tell them apart."""
    given = [s.overrides for s in settings if s.overrides is not None]
    paths = list(dict.fromkeys(path for own in given for path in own))
    told = [p for p in paths if len({json.dumps(o.get(p), sort_keys=True) for o in given}) > 1]
    body = [[s.label, s.family, json.dumps(s.strengths) if s.strengths else "–",
             ", ".join(map(str, sorted(s.runs))), ", ".join(r.root.name for r in s.runs.values())]
            + ([", ".join(f"`{p} = {json.dumps((s.overrides or {})[p])}`" for p in told
                          if p in (s.overrides or {})) or "–"] if given else [])
            for s in settings]
    return ["## Settings", "", *md_table(["setting", "family", "strengths", "seeds", "run directories",
                                           *(["overrides that differ"] if given else [])], body)]


def write_report(comparison: Comparison, out: Path, sources: list[Path]) -> Path:
    """Everything under `out`; returns the path of report.md. The files are written aside
    first and then moved in, report.md last: an interruption leaves the earlier report whole
    (or the new one), never tables of one with the plots and report of the other."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".writing-") as tmp:
        staged = Path(tmp)
        _write(comparison, staged, sources)
        written = {f.name for f in staged.iterdir()}
        for stale in [*out.glob("leak_vs_utility_*.png"), *out.glob("strength_*.png")]:
            if stale.name not in written:
                stale.unlink()
        report = CompareDir(out).report
        for name in sorted(written - {report.name}) + [report.name]:
            os.replace(staged / name, out / name)
    return report


def _write(comparison: Comparison, out: Path, sources: list[Path]) -> None:
    write_tables(comparison, out)
    warnings = list(comparison.warnings)
    found = trends(comparison.rows)
    attack_figures, family_figures = _draw(comparison, out, found, warnings)
    runs = sum(len(s.runs) for s in comparison.settings)
    lines = [REPORT_TITLE, "", *_verdict_md(comparison),
             f"{runs} runs in {len(comparison.settings)} settings from {', '.join(map(str, sources))}. "
             f"Leak at party {comparison.party}, {comparison.layer} layer. Every number is over a "
             "setting's seeds: the mean with its 95 % Student-t interval [low, high], and worst / best "
             "over seeds (GAFM's reporting). Plots and the Pareto frontier use "
             f"the {LEAK_LABELS[comparison.leak_stat]} (accuracy-type attacks: the accuracy). "
             f"{CLIPPED}.", "",
             "A setting is on the **Pareto frontier** of an attack when no other setting has at least "
             "its utility and at most its leak and is better in one of them (seed means; identical "
             "settings both stay on it). In a leak-vs-utility plot the frontier is "
             "the dashed staircase; up and to the left is better; filled markers are on it.", ""]
    for attack in comparison.attacks():
        rows = [r for r in comparison.rows if r["attack"] == attack]
        lines += attack_md(rows, attack_figures.get(attack))
    lines += _speed_md(comparison)
    lines += _dcs_md(comparison)
    lines += _trend_md(found, family_figures)
    lines += ["## Warnings", "", *(f"- {w}" for w in warnings or ["none"]), "",
              *_settings_md(comparison.settings)]
    CompareDir(out).report.write_text("\n".join(lines) + "\n")
