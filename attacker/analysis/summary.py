"""Run summaries of the per-batch leak rows: statistics over batches, the spread over R draws of
random side knowledge, pooled accuracy, skip counts, and batches above Marvell's bound."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from attacker.analysis.leak import pooled_accuracy, summarise
from attacker.attacks import ATTACKS
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.summary import LeakSummary, write_leak_summary

STATS = ("mean", "p95", "max")
Row = Mapping[str, Any]  # a leak.parquet row: a dict, or the analysis's LeakRow


def parties_key(row: Row) -> str:
    """"1" for one party, "1+2" for a colluding group (rows written before groups: party_id)."""
    return row.get("parties") or str(row["party_id"])


def _draw_stats(rows: Sequence[Row], column: str) -> tuple[dict[str, float | int], dict | None]:
    """Per draw, mean / p95 / max over the batches it scored; returns their mean over draws
    (with n = batches scored by any draw) and, for R > 1, the spread {stat: {std, min, max}}."""
    by_draw: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        by_draw[int(r.get("draw") or 0)].append(r[column])
    per_draw = [summarise(values) for _, values in sorted(by_draw.items())]
    merged: dict[str, float | int] = {s: _nanmean([d[s] for d in per_draw]) for s in STATS}
    merged["n"] = len({r["step"] for r in rows})
    if len(per_draw) < 2:
        return merged, None
    spread = {s: _spread([float(d[s]) for d in per_draw]) for s in STATS}
    return merged, spread


def _nanmean(values: list[Any]) -> float:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.mean(finite)) if finite else math.nan


def _spread(values: list[float]) -> dict[str, float]:
    finite = np.array([v for v in values if math.isfinite(v)])
    if finite.size == 0:
        return {"std": math.nan, "min": math.nan, "max": math.nan}
    return {"std": float(finite.std(ddof=1)) if finite.size > 1 else 0.0,
            "min": float(finite.min()), "max": float(finite.max())}


def _skips(rows: Sequence[Row]) -> tuple[int, int, int]:
    """(batches, batches skipped by every draw, of those skipped as degenerate)."""
    per_step: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        per_step[r["step"]].append(r)
    skipped = [draws for draws in per_step.values() if all(d["skip_reason"] is not None for d in draws)]
    degenerate = sum(1 for draws in skipped if any(_degenerate(d) for d in draws))
    return len(per_step), len(skipped), degenerate


def _degenerate(row: Row) -> bool:
    return row.get("skip_kind") == "degenerate" or str(row["skip_reason"]).startswith("degenerate")


def summarise_leak(per_batch: Sequence[Row],
                   threat: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per (parties, layer, attack): over the run and per epoch, mean / p95 / max of the metric
    over batches (raw and flip-corrected AUC, or accuracy), averaged over the R draws of random
    side knowledge with their spread; pooled accuracy for label attacks; skip counts.
    `threat` maps a parties key ("1", "1+2") to its threat-model description."""
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in per_batch:
        key = (parties_key(row), row["layer"], row["attack"])
        groups[key].append(row)
        groups[(*key, row["epoch"])].append(row)
    out = []
    for key, rows in groups.items():
        first = rows[0]
        kept = [r for r in rows if r["skip_reason"] is None]
        batches, skipped, degenerate = _skips(rows)
        draws = max(int(r.get("draw") or 0) for r in rows) + 1
        parties = [int(p) for p in key[0].split("+")]
        entry: dict[str, Any] = {
            "party_id": parties[0], "parties": parties, "layer": key[1], "attack": key[2],
            "name": first.get("name") or key[2].split("(")[0], "scope": "run" if len(key) == 3 else "epoch",
            "epoch": key[3] if len(key) == 4 else None,
            "side_knowledge": first["side_knowledge"], "threat": (threat or {}).get(key[0]),
            "metric": first["metric"], "seed": first["seed"], "draws": draws,
            "batches": batches, "skipped": skipped, "degenerate": degenerate}
        premise = _premise(rows)
        if premise is not None:
            entry["premise"] = premise
        if first["metric"] == "auc":
            spreads = {}
            for kind in ("raw", "flipped"):
                entry[kind], spreads[kind] = _draw_stats(kept, f"auc_{kind}")
            if draws > 1:
                entry["spread"] = spreads
            _add_threshold_accuracy(entry, kept)
            _add_anchors(entry, kept)
        elif first["metric"] == "count_error":  # one value per batch: the share misplaced
            entry["count_error"], _ = _draw_stats(kept, "count_error")
        else:
            entry["accuracy"], _ = _draw_stats(kept, "accuracy")
            entry["pooled"] = _pooled(rows)
        out.append(entry)
    return out


def _premise(rows: Sequence[Row]) -> str | None:
    """The reason, when the attack's premise failed on every batch (it was never scored)."""
    if all(r.get("skip_kind") == "premise" for r in rows):
        return str(rows[0]["skip_reason"]).removeprefix("premise: ")
    return None


def _add_threshold_accuracy(entry: dict[str, Any], kept: Sequence[Row]) -> None:
    """VFLAIR's attack performance of a score attack: its threshold rule's accuracy per batch,
    summarised as the AUC is (rows analysed before the rule existed have none)."""
    scored = [r for r in kept if r.get("threshold_accuracy") is not None]
    if scored:
        entry["threshold_accuracy"], _ = _draw_stats(scored, "threshold_accuracy")
        entry["threshold_rule"] = scored[0].get("threshold_rule")


def _add_anchors(entry: dict[str, Any], kept: Sequence[Row]) -> None:
    """Anchor attacks: how many scored (batch, draw) pairs used a received, not a clean, anchor."""
    sources = [r.get("anchor") for r in kept if r.get("anchor") is not None]
    if sources:
        entry["received_anchors"] = sources.count("received")


def with_family(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with its attack's VFLAIR family, VFLAIR's name for it and its attack
    performance (AP, for DCS: larger = the attack did better), as the plug-in declares them."""
    if entry.get("name") not in ATTACKS.names():  # a row of an attack this version lacks
        return {**entry, "family": None, "vflair": None, "ap": {"metric": None, "value": None}}
    cls = ATTACKS.get(entry["name"])
    return {**entry, "family": cls.family, "vflair": cls.vflair, "ap": cls.attack_performance(entry)}


def _pooled(rows: Sequence[Row]) -> dict[str, Any]:
    """Accuracy over rows (Fu et al.), with rows that got no prediction counted apart."""
    correct = [r.get("n_correct") or 0 for r in rows]
    predicted = [r.get("n_predicted") or 0 for r in rows]
    if not any(predicted) and any(r.get("accuracy") is not None for r in rows):
        # rows written before pooling existed: weigh each batch's accuracy by its rows
        predicted = [r["n_rows"] - r["n_excluded"] if r["accuracy"] is not None else 0 for r in rows]
        correct = [round((r["accuracy"] or 0.0) * n) for r, n in zip(rows, predicted, strict=True)]
    return {"accuracy": pooled_accuracy(correct, predicted), "correct": int(sum(correct)),
            "rows": int(sum(predicted)), "no_prediction": int(sum(r.get("n_no_prediction") or 0
                                                                 for r in rows))}


def headline_value(entry: dict[str, Any]) -> float | None:
    """The one number a table shows: p95 of the flip-corrected AUC, the pooled accuracy, or the
    mean count error."""
    if entry.get("flipped"):
        return entry["flipped"]["p95"]
    if entry.get("count_error"):
        return entry["count_error"]["mean"]
    pooled = entry.get("pooled") or {}
    if pooled.get("accuracy") is not None:
        return pooled["accuracy"]
    return (entry.get("accuracy") or {}).get("p95")


def headline(summary: dict[str, Any], layer: str = "cut") -> dict[str, dict[str, Any]]:
    """attack -> {"mean", "p95", "max", "value"} over the run, for the first attacking party at
    `layer`: the flip-corrected AUC (value: its p95), or per-batch accuracy (value: pooled);
    attacks whose premise failed are left out (report.md says why)."""
    entries = [e for e in summary["leak"] if e["scope"] == "run" and e["layer"] == layer
               and len(e.get("parties") or [e["party_id"]]) == 1 and not e.get("premise")]
    if not entries:
        return {}
    party = min(e["party_id"] for e in entries)
    table = {}
    for e in entries:
        if e["party_id"] == party:
            stats = metric_stats(e)
            table[e["attack"]] = {**{k: stats.get(k) for k in STATS}, "value": headline_value(e)}
    return table


def metric_stats(entry: dict[str, Any]) -> dict[str, Any]:
    """The summary of an entry's headline metric: flip-corrected AUC, accuracy or count error."""
    return entry.get("flipped") or entry.get("accuracy") or entry.get("count_error") or {}


def marvell_bounds(records: list[dict[str, Any]]) -> dict[int, dict[int, float]]:
    """party -> step -> the Theorem-1 AUC bound a defense logged for that batch (the lowest
    if several defenses in the chain logged one: every attack's AUC is below each of them)."""
    found: dict[int, dict[int, float]] = defaultdict(dict)
    for r in (r for r in records if r.get("type") == "train"):
        for key, diagnostics in r.items():
            if key.startswith("defense.") and isinstance(diagnostics, dict):
                values = [v for k, v in diagnostics.items() if k.endswith("auc_bound") and v is not None]
                if values:
                    found[int(key.removeprefix("defense."))][int(r["step"])] = min(values)
    return dict(found)


def above_bound(per_batch: Sequence[Row], bounds: dict[int, dict[int, float]],
                exempt: Collection[str] = ()) -> list[dict]:
    """Per (party, attack) at the cut layer: batches whose leak AUC (flip-corrected, mean over
    draws) exceeds Marvell's Theorem-1 bound logged for that batch, and by how much. `exempt`:
    attacks the bound does not cover (their score of a row reads the row's own label)."""
    values: dict[tuple[int, str, int], list[float]] = defaultdict(list)
    for r in per_batch:
        party = r["party_id"]
        if (r["layer"] == "cut" and r["metric"] == "auc" and r["skip_reason"] is None
                and r["attack"] not in exempt
                and parties_key(r) == str(party) and r["step"] in bounds.get(party, {})):
            values[(party, r["attack"], r["step"])].append(r["auc_flipped"])
    compared: dict[tuple[int, str], list[float]] = defaultdict(list)
    for (party, attack, step), aucs in values.items():
        compared[(party, attack)].append(float(np.mean(aucs)) - bounds[party][step])
    out = []
    for (party, attack), excess in compared.items():
        over = [x for x in excess if x > 0]
        if over:
            out.append({"party_id": party, "attack": attack, "batches": len(excess),
                        "above": len(over), "max_excess": max(over), "mean_excess": float(np.mean(over))})
    return out


def write_summary(run: RunDir, summary: dict[str, Any]) -> None:
    """report/summary.json, stamped with its schema version (splitleak.artifacts.summary)."""
    write_leak_summary(run, LeakSummary.of(summary))
