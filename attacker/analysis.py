"""Offline leak analysis of a run directory: every attack on every logged batch, summarised."""

from __future__ import annotations

import json
import math
import tomllib
from collections import defaultdict, deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from attacker.attacks import DEFAULT_ATTACKS, DEFAULT_MULTICLASS_ATTACKS, Attack, build_attack
from attacker.leak import attack_rng, evaluate_batch, summarise
from attacker.store import GradientLog, repair_log
from splitleak.fileio import write_atomically
from splitleak.metrics_log import read_metrics
from splitleak.rundir import RunDir

LAYERS = {"cut_gradient": "cut", "first_layer_gradient": "first", "activation": "activation"}
SAMPLED_BATCHES = 5  # early and late batches whose per-row figures feed the plots


def default_attacks(num_classes: int, hints: Iterable[int] = (1, 3, 5)) -> list[tuple[str, dict]]:
    """The attacks a run is analysed with when none are named: binary or multi-class set."""
    if num_classes > 2:
        return list(DEFAULT_MULTICLASS_ATTACKS)
    specs: list[tuple[str, dict]] = []
    for name, params in DEFAULT_ATTACKS:
        if name in ("hint_distance", "hint_inner"):
            if params["k"] == 1:  # one entry per requested k, in place of the defaults
                specs += [(name, {"k": k}) for k in hints]
        else:
            specs.append((name, params))
    return specs


class _RowSample:
    """Per-row norms and cosines of the first and last few batches, for the histograms."""

    def __init__(self) -> None:
        self.early: dict[tuple[int, str], list[list[dict[str, Any]]]] = defaultdict(list)
        self.late: dict[tuple[int, str], deque[list[dict[str, Any]]]] = defaultdict(
            lambda: deque(maxlen=SAMPLED_BATCHES))

    def add(self, party: int, layer: str, step: int, grads: np.ndarray, labels: np.ndarray,
            rng: np.random.Generator) -> None:
        norms = np.linalg.norm(grads, axis=1)
        positives = np.flatnonzero(labels == 1)
        cosine = np.full(labels.shape, np.nan)
        if positives.size:
            anchor = grads[rng.choice(positives)]
            denominator = norms * np.linalg.norm(anchor)
            np.divide(grads @ anchor, denominator, out=cosine, where=denominator > 0)
        rows = [{"party_id": party, "layer": layer, "step": step, "label": int(y),
                 "norm": float(n), "cosine_oracle": float(c)}
                for y, n, c in zip(labels, norms, cosine, strict=True)]
        early = self.early[(party, layer)]
        (early if len(early) < SAMPLED_BATCHES else self.late[(party, layer)]).append(rows)

    def table(self) -> pa.Table:
        rows = [dict(r, phase="early") for b in self.early.values() for batch in b for r in batch]
        rows += [dict(r, phase="late") for b in self.late.values() for batch in b for r in batch]
        return pa.Table.from_pylist(rows) if rows else pa.table({})


class AnalysisInputError(ValueError):
    """The directory is not an analysable run (missing, not a run, unreadable inputs)."""


def _labels_by_id(run: RunDir) -> np.ndarray:
    if not run.labels.exists():
        raise FileNotFoundError(f"no label export at {run.labels}: the label party writes it "
                                "when training starts (did the run start?)")
    try:
        table = pq.read_table(run.labels, columns=["sample_id", "label"])
    except (pa.ArrowException, OSError, KeyError) as err:
        raise AnalysisInputError(f"{run.labels} is not a readable label export: {err}") from None
    ids = table.column("sample_id").to_numpy()
    labels = table.column("label").to_numpy()
    if ids.size == 0:
        raise AnalysisInputError(f"{run.labels} holds no labels")
    if ids.min() < 0 or labels.min() < 0:
        raise AnalysisInputError(f"{run.labels} holds negative sample ids or labels")
    lookup = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
    lookup[ids] = labels
    return lookup


def run_seed(run: RunDir) -> int:
    try:
        seed = tomllib.loads(run.config.read_text()).get("run", {}).get("seed", 0)
        return int(seed)
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise AnalysisInputError(f"{run.config} is not a readable experiment config: {err}") from None


def check_run_dir(run: RunDir) -> None:
    if not run.root.is_dir():
        raise AnalysisInputError(f"{run.root} does not exist or is not a directory")
    if not run.config.is_file():
        raise AnalysisInputError(f"{run.root} is not a run directory (it has no config.toml)")


def partial_run(run: RunDir) -> dict[str, Any] | None:
    """How far a run that did not finish got (None for a finished run)."""
    try:
        outcome = json.loads(run.outcome.read_text())
    except (OSError, ValueError):
        outcome = {"status": "unknown (no label_party/outcome.json: still running, or killed)"}
    if outcome.get("status") == "ok":
        return None
    records = list(read_metrics(run.metrics)) if run.metrics.exists() else []
    plan = next((r for r in records if r.get("type") == "plan"), {})
    steps = sum(1 for r in records if r.get("type") == "train")
    return {"status": outcome.get("status"), "step": outcome.get("step"),
            "message": outcome.get("message"), "train_steps_done": steps,
            "train_steps_planned": plan.get("total_train_steps")}


def analyze(run_dir: Path, attacks: list[tuple[str, dict]] | None = None,
            hints: Iterable[int] = (1, 3, 5), seed: int | None = None) -> dict[str, Any]:
    """Analyse the gradient log of `run_dir`; writes attacker/leak.parquet and
    attacker/rows.parquet and returns the summary (also written by the report)."""
    run = RunDir(Path(run_dir))
    check_run_dir(run)
    repaired = repair_log(run.attacker / "gradients")
    log = GradientLog(run.attacker / "gradients")
    labels = _labels_by_id(run)
    num_classes = int(labels.max()) + 1 if labels.size else 2
    num_classes = max(num_classes, 2)
    seed = run_seed(run) if seed is None else seed
    built: list[Attack] = [build_attack(n, p) for n, p in
                           (attacks or default_attacks(num_classes, hints))]
    per_batch: list[dict[str, Any]] = []
    sample = _RowSample()
    epoch_attacks = [a for a in built if a.per_epoch]
    for party in log.parties():
        pool = _EpochPool()
        for batch in log.batches(party):
            ids = batch.sample_ids
            y = labels[ids] if ids.size and 0 <= ids.min() and ids.max() < labels.size else None
            if y is None or (y < 0).any():
                raise AnalysisInputError(f"party {party} step {batch.step}: sample ids without a "
                                         "label in the label export (another run's labels?)")
            if batch.epoch != pool.epoch:
                per_batch += pool.evaluate(epoch_attacks, party, seed, num_classes)
                pool = _EpochPool(batch.epoch)
            for column, grads in batch.tensors.items():
                layer = LAYERS.get(column)
                if layer is None:
                    continue
                for attack in built:
                    if not _applies(attack, layer, num_classes):
                        continue
                    if attack.per_epoch:
                        pool.add(layer, batch.step, grads, y)
                        continue
                    rng = attack_rng(seed, batch.step, party, f"{layer}:{attack.label}")
                    result = evaluate_batch(attack, grads, y, rng, num_classes)
                    per_batch.append(_row(party, layer, batch.epoch, batch.step, attack, result,
                                          seed))
                if num_classes == 2 and layer != "activation":
                    sample.add(party, layer, batch.step, grads, y,
                               attack_rng(seed, batch.step, party, f"{layer}:sample"))
        per_batch += pool.evaluate(epoch_attacks, party, seed, num_classes)
    leak = pa.Table.from_pylist(per_batch, schema=LEAK_SCHEMA)
    write_atomically(run.attacker / "leak.parquet", lambda tmp: pq.write_table(leak, tmp))
    rows = sample.table()
    if rows.num_rows:
        write_atomically(run.attacker / "rows.parquet", lambda tmp: pq.write_table(rows, tmp))
    partial = partial_run(run)
    warnings = [*repaired, *log.warnings]
    if partial is not None:
        warnings.insert(0, f"partial run ({partial['status']}"
                           f"{'' if partial['step'] is None else ' at step ' + str(partial['step'])}): "
                           f"{partial['train_steps_done']} of {partial['train_steps_planned']} train "
                           "steps were done; this analyses what was recorded")
    return {"run_id": log.run_id or run.root.name, "seed": seed, "num_classes": num_classes,
            "partial": partial, "warnings": warnings, "leak": summarise_leak(per_batch)}


def _applies(attack: Attack, layer: str, num_classes: int) -> bool:
    if attack.metric_kind(num_classes) == "score" and num_classes > 2:
        return False  # scores rank two classes
    if layer == "activation":  # what the party sent, not a gradient
        return attack.on_activations
    return layer == "cut" or not attack.cut_layer_only  # logit gradients: the cut layer only


class _EpochPool:
    """One epoch's gradient rows and labels per layer, for attacks run once per epoch."""

    def __init__(self, epoch: int = -1) -> None:
        self.epoch = epoch
        self.rows: dict[str, list[tuple[int, np.ndarray, np.ndarray]]] = defaultdict(list)

    def add(self, layer: str, step: int, grads: np.ndarray, labels: np.ndarray) -> None:
        batches = self.rows[layer]
        if not batches or batches[-1][0] != step:  # several epoch attacks share one copy
            batches.append((step, grads.reshape(grads.shape[0], -1), labels))

    def evaluate(self, attacks: list[Attack], party: int, seed: int,
                 num_classes: int) -> list[dict[str, Any]]:
        """One row per (layer, attack) that saw this epoch, at the epoch's last step."""
        rows = []
        for layer, batches in self.rows.items():
            step = batches[-1][0]
            grads = np.concatenate([g for _, g, _ in batches])
            y = np.concatenate([t for _, _, t in batches])
            for attack in attacks:
                if _applies(attack, layer, num_classes):
                    rng = attack_rng(seed, step, party, f"{layer}:{attack.label}")
                    result = evaluate_batch(attack, grads, y, rng, num_classes)
                    rows.append(_row(party, layer, self.epoch, step, attack, result, seed))
        return rows


LEAK_SCHEMA = pa.schema([
    ("party_id", pa.int32()), ("layer", pa.string()), ("epoch", pa.int32()), ("step", pa.int64()),
    ("attack", pa.string()), ("name", pa.string()), ("side_knowledge", pa.string()),
    ("metric", pa.string()), ("auc_raw", pa.float64()), ("auc_flipped", pa.float64()),
    ("accuracy", pa.float64()), ("n_rows", pa.int64()), ("n_excluded", pa.int64()),
    ("n_pos", pa.int64()), ("skip_reason", pa.string()), ("seed", pa.int64()),
    ("count_error", pa.float64()),
])


def _row(party: int, layer: str, epoch: int, step: int, attack: Attack, result: Any,
         seed: int) -> dict[str, Any]:
    return {"party_id": party, "layer": layer, "epoch": epoch, "step": step,
            "attack": attack.label, "name": attack.name, "side_knowledge": attack.side_knowledge,
            "metric": result.metric,
            "auc_raw": result.auc.raw if result.auc else None,
            "auc_flipped": result.auc.flipped if result.auc else None,
            "accuracy": result.accuracy, "n_rows": result.n_rows,
            "n_excluded": result.n_excluded, "n_pos": result.auc.n_pos if result.auc else None,
            "skip_reason": result.skip_reason, "seed": seed, "count_error": result.count_error}


def summarise_leak(per_batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (party, layer, attack): over the run and per epoch, mean / p95 / max of the metric
    (raw and flip-corrected AUC, or accuracy) and the number of skipped batches."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in per_batch:
        groups[(row["party_id"], row["layer"], row["attack"])].append(row)
        groups[(row["party_id"], row["layer"], row["attack"], row["epoch"])].append(row)
    out = []
    for key, rows in groups.items():
        first = rows[0]
        kept = [r for r in rows if r["skip_reason"] is None]
        entry: dict[str, Any] = {
            "party_id": key[0], "layer": key[1], "attack": key[2],
            "scope": "run" if len(key) == 3 else "epoch",
            "epoch": key[3] if len(key) == 4 else None,
            "side_knowledge": first["side_knowledge"], "metric": first["metric"],
            "seed": first["seed"], "batches": len(rows), "skipped": len(rows) - len(kept)}
        if first["metric"] == "auc":
            entry["raw"] = summarise([r["auc_raw"] for r in kept])
            entry["flipped"] = summarise([r["auc_flipped"] for r in kept])
        else:  # accuracy, or count_error: one value per batch under the metric's own name
            entry[first["metric"]] = summarise([r[first["metric"]] for r in kept])
        out.append(entry)
    return out


def headline(summary: dict[str, Any], layer: str = "cut") -> dict[str, dict[str, float]]:
    """attack -> {"mean", "p95", "max"} of the flip-corrected AUC (or accuracy, or count
    error) over the run, for the first observed party at `layer`."""
    entries = [e for e in summary["leak"] if e["scope"] == "run" and e["layer"] == layer]
    if not entries:
        return {}
    party = min(e["party_id"] for e in entries)
    table = {}
    for e in entries:
        if e["party_id"] == party:
            stats = metric_stats(e)
            table[e["attack"]] = {k: stats[k] for k in ("mean", "p95", "max")}
    return table


def metric_stats(entry: dict[str, Any]) -> dict[str, Any]:
    """The summary of an entry's headline metric: flip-corrected AUC, accuracy or count error."""
    return entry.get("flipped") or entry.get("accuracy") or entry.get("count_error") or {}


def write_summary(run: RunDir, summary: dict[str, Any]) -> None:
    text = json.dumps(summary, indent=2, default=_json_default)
    write_atomically(run.report / "summary.json", lambda tmp: tmp.write_text(text))


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
