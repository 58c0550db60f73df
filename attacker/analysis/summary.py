"""Run summaries of the per-batch leak rows: statistics over batches, the spread over R draws of
random side knowledge, pooled accuracy, skip counts, and batches above Marvell's bound."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from attacker.analysis.leak import pooled_accuracy, summarise
from attacker.analysis.leak_file import Batches, LeakGroup, leak_groups, row_batches
from attacker.analysis.staging import Outputs, locked_outputs
from attacker.attacks import ATTACKS
from attacker.attacks._batch import SCALAR_ROWS
from splitleak.artifacts.artifact import write_model
from splitleak.artifacts.metrics_log import MetricsLog, StepBounds
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.summary import AnalysisTiming, LeakSummary

STATS = ("mean", "p95", "max")
# a run-level attack's figures that time it: in report/timing.json, never in the summary
TIMING_KEYS = ("cpu_seconds", "fit_cpu_seconds", "seconds")
Row = Mapping[str, Any]  # a leak.parquet row: a dict, or the analysis's LeakRow
SUMMARY_COLUMNS = ["party_id", "epoch", "step", "draw", "name", "side_knowledge", "metric", "seed",
                   "skip_reason", "skip_kind", "auc_raw", "auc_flipped", "accuracy", "count_error",
                   "threshold_accuracy", "threshold_rule", "anchor", "n_correct", "n_predicted",
                   "n_no_prediction", "n_rows", "n_excluded"]
SCORED_COLUMNS = ["step", "draw", "auc_raw", "auc_flipped", "accuracy", "count_error",
                  "threshold_accuracy", "threshold_rule", "anchor"]  # what the scored rows' figures read
Threat = Callable[[str], str | None]  # a parties key ("1", "1+2") -> its threat-model description


@dataclass
class LeakFigures:
    """What the summary takes from every leak row, computed a (parties, layer, attack) at a time."""

    leak: list[dict[str, Any]]  # summarise_leak's entries
    above_bound: list[dict[str, Any]]
    scalar_rows: list[tuple[str, str, str, int]]  # (parties, layer, attack, batches) of SCALAR_ROWS


def leak_figures(batches: Batches, threat: Threat = lambda _: None,
                 bounds: Mapping[int, Mapping[int, float]] | None = None,
                 exempt: Collection[str] = ()) -> LeakFigures:
    """The leak entries, batches above Marvell's bound and the batches skipped with SCALAR_ROWS,
    each in the order of the row it first appears at, from the rows read a group at a time."""
    entries: list[tuple[int, int, dict[str, Any]]] = []
    above: list[tuple[int, dict[str, Any]]] = []
    scalar: list[tuple[int, tuple[str, str, str, int]]] = []
    for group in leak_groups(batches, SUMMARY_COLUMNS):
        entries += _group_entries(group, threat)
        above += _above(group, bounds or {}, exempt)
        scalar += _scalar_batches(group)
    return LeakFigures([e for *_, e in sorted(entries, key=lambda e: e[:2])],
                       [a for _, a in sorted(above, key=lambda a: a[0])],
                       [s for _, s in sorted(scalar, key=lambda s: s[0])])


def summarise_leak(per_batch: Sequence[Row],
                   threat: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per (parties, layer, attack): over the run and per epoch, mean / p95 / max of the metric
    over batches (raw and flip-corrected AUC, or accuracy), averaged over the R draws of random
    side knowledge with their spread; pooled accuracy for label attacks; skip counts.
    `threat` maps a parties key ("1", "1+2") to its threat-model description."""
    return leak_figures(row_batches(per_batch), (threat or {}).get).leak


def above_bound(per_batch: Sequence[Row], bounds: Mapping[int, Mapping[int, float]],
                exempt: Collection[str] = ()) -> list[dict]:
    """Per (party, attack) at the cut layer: batches whose leak AUC (flip-corrected, mean over
    draws) exceeds Marvell's Theorem-1 bound logged for that batch, and by how much. `exempt`:
    attacks the bound does not cover (their score of a row reads the row's own label)."""
    return leak_figures(row_batches(per_batch), bounds=bounds, exempt=exempt).above_bound


def _ints(rows: pa.Table, column: str) -> np.ndarray:
    return pc.fill_null(rows[column], 0).to_numpy()


def _floats(rows: pa.Table, column: str) -> np.ndarray:
    """The column as float64, a null as NaN (as np.asarray makes of None)."""
    return rows[column].to_numpy().astype(np.float64, copy=False)


def _text(rows: pa.Table, column: str) -> pa.ChunkedArray:
    return pc.cast(rows[column], pa.string())


def _mask(condition: pa.ChunkedArray) -> np.ndarray:
    """A per-row condition as booleans, null (a missing value) as False."""
    return np.asarray(pc.fill_null(condition, False).to_numpy(), dtype=bool)


def _where(rows: pa.Table, mask: np.ndarray) -> pa.Table:
    return rows.filter(pa.array(mask, type=pa.bool_()))


def _group_entries(group: LeakGroup, threat: Threat) -> list[tuple[int, int, dict[str, Any]]]:
    """(first row, 0, the run's entry) and (first row, 1, an epoch's entry) per epoch: sorted by
    both, the order summarise_leak met them in (a group's first row starts it and its epoch)."""
    rows, first_rows = group.rows, group.rows["row"].to_numpy()
    epochs = rows["epoch"].to_numpy()
    out = [(int(first_rows[0]), 0, _entry(group, rows, None, threat))]
    found, firsts = np.unique(epochs, return_index=True)
    for epoch, first in zip(found.tolist(), firsts.tolist(), strict=True):
        out.append((int(first_rows[first]), 1, _entry(group, _where(rows, epochs == epoch), epoch,
                                                      threat)))
    return out


def _entry(group: LeakGroup, rows: pa.Table, epoch: int | None, threat: Threat) -> dict[str, Any]:
    first = rows.slice(0, 1).to_pylist()[0]
    kept = _where(rows.select(SCORED_COLUMNS), _mask(pc.is_null(rows["skip_reason"])))
    batches, skipped, degenerate = _skips(rows)
    draws = int(_ints(rows, "draw").max()) + 1
    parties = [int(p) for p in group.parties.split("+")]
    entry: dict[str, Any] = {
        "party_id": parties[0], "parties": parties, "layer": group.layer, "attack": group.attack,
        "name": first.get("name") or group.attack.split("(")[0],
        "scope": "run" if epoch is None else "epoch", "epoch": epoch,
        "side_knowledge": first["side_knowledge"], "threat": threat(group.parties),
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
    return entry


def _draw_stats(rows: pa.Table, column: str) -> tuple[dict[str, float | int], dict | None]:
    """Per draw, mean / p95 / max over the batches it scored; returns their mean over draws
    (with n = batches scored by any draw) and, for R > 1, the spread {stat: {std, min, max}}."""
    draws, values = _ints(rows, "draw"), _floats(rows, column)
    per_draw = [summarise(values[draws == draw]) for draw in np.unique(draws)]
    merged: dict[str, float | int] = {s: _nanmean([d[s] for d in per_draw]) for s in STATS}
    merged["n"] = int(np.unique(rows["step"].to_numpy()).size)
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


def _skips(rows: pa.Table) -> tuple[int, int, int]:
    """(batches, batches skipped by every draw, of those skipped as degenerate)."""
    steps, inverse = np.unique(rows["step"].to_numpy(), return_inverse=True)
    reasons = _text(rows, "skip_reason")
    skipped = _mask(pc.is_valid(reasons))
    degenerate = _mask(pc.equal(rows["skip_kind"], "degenerate")) | \
        _mask(pc.starts_with(reasons, "degenerate"))
    every_draw = np.bincount(inverse, weights=skipped, minlength=steps.size) == \
        np.bincount(inverse, minlength=steps.size)
    any_degenerate = np.bincount(inverse, weights=degenerate, minlength=steps.size) > 0
    return int(steps.size), int(every_draw.sum()), int((every_draw & any_degenerate).sum())


def _premise(rows: pa.Table) -> str | None:
    """The reason, when the attack's premise failed on every batch it could be scored on (it was
    never scored: e.g. a batch with no positive needs no clean anchor, and is skipped anyway)."""
    premise = _mask(pc.equal(rows["skip_kind"], "premise"))
    if premise.any() and _mask(pc.is_valid(rows["skip_reason"])).all():
        return str(rows["skip_reason"][int(np.argmax(premise))].as_py()).removeprefix("premise: ")
    return None


def _add_threshold_accuracy(entry: dict[str, Any], kept: pa.Table) -> None:
    """VFLAIR's attack performance of a score attack: its threshold rule's accuracy per batch,
    summarised as the AUC is (rows analysed before the rule existed have none)."""
    scored = _where(kept, _mask(pc.is_valid(kept["threshold_accuracy"])))
    if scored.num_rows:
        entry["threshold_accuracy"], _ = _draw_stats(scored, "threshold_accuracy")
        entry["threshold_rule"] = scored["threshold_rule"][0].as_py()


def _add_anchors(entry: dict[str, Any], kept: pa.Table) -> None:
    """Anchor attacks: how many scored (batch, draw) pairs used a received, not a clean, anchor."""
    sources = kept["anchor"]
    if _mask(pc.is_valid(sources)).any():
        entry["received_anchors"] = int(_mask(pc.equal(sources, "received")).sum())


def with_family(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with its attack's VFLAIR family, VFLAIR's name for it and its attack
    performance (AP, for DCS: larger = the attack did better), as the plug-in declares them."""
    if entry.get("name") not in ATTACKS.names():  # a row of an attack this version lacks
        return {**entry, "family": None, "vflair": None, "ap": {"metric": None, "value": None}}
    cls = ATTACKS.get(entry["name"])
    return {**entry, "family": cls.family, "vflair": cls.vflair, "ap": cls.attack_performance(entry)}


def _pooled(rows: pa.Table) -> dict[str, Any]:
    """Accuracy over rows (Fu et al.), with rows that got no prediction counted apart."""
    correct, predicted = _ints(rows, "n_correct"), _ints(rows, "n_predicted")
    scored = _mask(pc.is_valid(rows["accuracy"]))
    if not predicted.any() and scored.any():
        # rows written before pooling existed: weigh each batch's accuracy by its rows
        predicted = np.where(scored, _ints(rows, "n_rows") - _ints(rows, "n_excluded"), 0)
        correct = np.rint(np.where(scored, _floats(rows, "accuracy"), 0.0) * predicted).astype(np.int64)
    return {"accuracy": pooled_accuracy(correct, predicted), "correct": int(correct.sum()),
            "rows": int(predicted.sum()), "no_prediction": int(_ints(rows, "n_no_prediction").sum())}


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


def marvell_bounds(metrics: MetricsLog) -> dict[int, StepBounds]:
    """party -> step -> the Theorem-1 AUC bound a defense logged for that batch (the lowest
    if several defenses in the chain logged one: every attack's AUC is below each of them)."""
    return metrics.auc_bounds


def _above(group: LeakGroup, bounds: Mapping[int, Mapping[int, float]],
           exempt: Collection[str]) -> list[tuple[int, dict[str, Any]]]:
    """A cut-layer group of one party: its batches whose AUC (flip-corrected, mean over draws)
    exceeds the bound logged for the batch, with the row its first compared batch is at."""
    rows = group.rows
    if group.layer != "cut" or group.attack in exempt:
        return []
    own = _mask(pc.equal(pc.cast(rows["party_id"], pa.string()), group.parties))
    limits = bounds.get(int(group.parties), {}) if own.any() else {}
    steps = rows["step"].to_numpy()
    compared = own & _mask(pc.equal(rows["metric"], "auc")) & \
        _mask(pc.is_null(rows["skip_reason"])) & np.isin(steps, list(limits))
    if not compared.any():
        return []
    excess = [float(np.mean(aucs)) - limits[step]
              for step, aucs in _by_step(steps[compared], _floats(rows, "auc_flipped")[compared])]
    over = [x for x in excess if x > 0]
    first = int(rows["row"].to_numpy()[compared][0])
    return [(first, {"party_id": int(group.parties), "attack": group.attack, "batches": len(excess),
                     "above": len(over), "max_excess": max(over),
                     "mean_excess": float(np.mean(over))})] if over else []


def _by_step(steps: np.ndarray, values: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The values of each step, in row order, the steps in the order they first appear."""
    found, firsts, inverse = np.unique(steps, return_index=True, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    split = np.split(values[order], np.cumsum(np.bincount(inverse, minlength=found.size))[:-1])
    return [(int(found[i]), split[i]) for i in np.argsort(firsts, kind="stable")]


def _scalar_batches(group: LeakGroup) -> list[tuple[int, tuple[str, str, str, int]]]:
    """The batches the group's direction attack skipped as SCALAR_ROWS, with its first such row."""
    scalar = _mask(pc.starts_with(_text(group.rows, "skip_reason"), SCALAR_ROWS))
    if not scalar.any():
        return []
    batches = int(np.unique(group.rows["step"].to_numpy()[scalar]).size)
    return [(int(group.rows["row"].to_numpy()[scalar][0]),
             (group.parties, group.layer, group.attack, batches))]


def write_summary(run: RunDir, summary: dict[str, Any], out: Outputs | None = None) -> None:
    """report/summary.json, stamped with its schema version (splitleak.artifacts.summary), and
    report/timing.json, how long the run-level attacks took: what differs between two analyses
    of a run is never in the summary. `out`: the analysis's staging (none: both replace the
    run's at once, under the run's lock: RunInUse while another process runs or analyses it)."""
    if out is None:
        with locked_outputs(run) as own:
            write_summary(run, summary, own)
            own.commit()
        return
    kept, timings = split_timing(summary)
    write_model(out.staged(run.leak_summary), LeakSummary.of(kept))
    out.superseded += (out.timing.name,)
    if timings:
        write_model(out.timing, AnalysisTiming(run_attacks=timings))
    else:
        out.timing.unlink(missing_ok=True)


def split_timing(summary: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary without its run-level attacks' times, and those times, one dict per attack
    and attacker (its party, parties, attack and layer, and the times its figures held)."""
    entries, timings = [], []
    for entry in summary.get("leak", []):
        kept = {key: _without_timing(value) for key, value in entry.items()}
        times = {name: value[name] for value in entry.values() if isinstance(value, dict)
                 for name in TIMING_KEYS if name in value}
        entries.append(kept)
        if times:
            timings.append({key: entry[key] for key in ("party_id", "parties", "attack", "layer")
                            if key in entry} | times)
    return {**summary, "leak": entries}, timings


def _without_timing(value: Any) -> Any:
    return {k: v for k, v in value.items() if k not in TIMING_KEYS} if isinstance(value, dict) \
        else value
