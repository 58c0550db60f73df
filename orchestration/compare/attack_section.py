"""One attack's section of report.md: every setting's utility and leak over seeds, what its
leak is, and a run-level attack's further figures."""

from __future__ import annotations

import json
from typing import Any

from orchestration.compare.markdown import (
    LEAK_LABELS,
    METRIC_HEADERS,
    METRIC_LABELS,
    UTILITY_LABELS,
    change,
    ci,
    md_table,
    num,
    worst_best,
)
from orchestration.compare.table import UNRANKED


def _leak_cells(row: dict[str, Any], auc: bool) -> list[str]:
    if not auc:  # the headline, then the per-batch metric's mean and p95 over batches
        return [ci(row, "leak"),
                f"{num(row['leak_batch_mean_mean'])} / {num(row['leak_batch_p95_mean'])}"]
    return [ci(row, "leak_flipped_p95"), ci(row, "leak_flipped_mean"),
            num(row["leak_raw_p95_mean"]), num(row["leak_raw_mean_mean"])]


def _figures_md(rows: list[dict[str, Any]]) -> list[str]:
    """A run-level attack's further figures per setting (model completion: its test top-1 and,
    where the runs trained them, its baselines), each with its change against no defense."""
    figures = {r["setting"]: json.loads(r["figures"]) for r in rows}
    names = list(dict.fromkeys(name for own in figures.values() for name in own))
    if not names:
        return []
    body = [[setting, *(ci(own[name], "value") + (f" ({change(own[name], 'change')})"
                                              if own[name].get("change_mean") is not None else "")
                        if name in own else "–" for name in names)]
            for setting, own in figures.items()]
    return ["Further figures of the attack (top-1 accuracy for model completion: `test` on the "
            "test rows; `labelled_only` a head trained on the labelled rows alone and "
            "`random_bottom` the attack on an untrained bottom, where the runs trained them), "
            "mean [CI] (mean per-seed change against no defense):", "",
            *md_table(["setting", *names], body)]


def attack_md(rows: list[dict[str, Any]], figure: str | None) -> list[str]:
    first = rows[0]
    utility = UTILITY_LABELS.get(first["utility_metric"], first["utility_metric"])
    lines = [f"## {first['attack']}" + (" (diagnostic)" if first["diagnostic"] else ""), "",
             f"Side knowledge: {first['side_knowledge'] or 'none stated'}. "
             f"Type: {first['attack_type']}" + (f" (VFLAIR's {first['vflair']})" if first["vflair"]
                                                 else "") +
             f". Party {first['party']}, {first['layer']} layer.", ""]
    if first["diagnostic"]:
        lines += [f"**Diagnostic**, not the figure to set beside the papers' and left out of T-DCS, "
                  f"C-DCS and the verdicts: {first['diagnostic']}.", ""]
    elif not first["in_t_dcs"]:
        lines += ["**Not VFLAIR's**: its entries name no VFLAIR counterpart, so its DCS below is "
                  "left out of T-DCS and C-DCS.", ""]
    if not first["ranked"]:
        lines += [f"**Not ranked**: {UNRANKED[first['metric']]}. It is on no Pareto frontier and "
                  "has no verdict; its change against no defense says what a defense did.", ""]
    auc = first["metric"] == "auc"
    leak_header = ["p95 flipped [CI]", "mean flipped [CI]", "p95 raw", "mean raw"] if auc else [
        f"{METRIC_HEADERS.get(first['metric'], first['metric'])} [CI]", "batch mean / p95"]
    header = ["setting", "seeds", f"{utility} [CI]", f"{utility} worst / best", "drop vs no defense [CI]",
              "relative drop (ADR) [CI]", *leak_header, "leak change vs no defense [CI]",
              "leak worst / best", "draw spread", "AP [CI]", "DCS [CI]", "DCS ours [CI]", "Pareto"]
    body = [[r["setting"], str(r["n_seeds"]), ci(r, "utility"), worst_best(r, "utility"),
             ci(r, "utility_drop"), ci(r, "relative_drop"), *_leak_cells(r, auc),
             change(r, "leak_change"), worst_best(r, "leak"), num(r["spread_mean"]), ci(r, "ap"),
             ci(r, "dcs"), ci(r, "dcs_ours"), "✓" if r["pareto"] else ""] for r in rows]
    lines += md_table(header, body)
    leak = METRIC_LABELS.get(first["metric"]) or LEAK_LABELS.get(first["headline"], first["headline"])
    lines += [f"Leak = {leak} for the change, worst / best and the frontier; flipped = max(AUC, "
              "1 − AUC) (GAFM), raw = the attack's AUC as scored; batch mean / p95 = the attack's "
              "per-batch metric over batches. Leak change = the mean over seeds of (leak − the "
              "same seed's leak without a defense) / that leak. Relative drop = drop / the no-defense "
              "utility (Luo & Zhang's accuracy degradation ratio, ADR). Draw spread: across the "
              "random side-knowledge draws, when the analysis made several. AP = the attack "
              "performance DCS is computed from (see Defense capability)"
              + (f"; threshold rule: {first['threshold_rule']}" if first.get("threshold_rule") else "")
              + ".", ""]
    lines += _figures_md(rows)
    if figure:
        lines += [f"![{first['attack']}: leak vs utility]({figure})", ""]
    return lines
