"""The leak report: compact tables in the terminal, report/report.md with its plots beside it."""

from __future__ import annotations

import json
import logging
import math
import re
import tomllib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attacker.analysis import headline, metric_stats
from splitleak.fileio import write_atomically
from splitleak.metrics_log import read_metrics
from splitleak.rundir import RunDir

log = logging.getLogger("attacker.report")

FLIPPED = "flip-corrected leak AUC max(AUC, 1 − AUC)"
OTHER_METRICS = "label attacks: label accuracy; count attacks: count error Σ|n̂ − n|/2B, 0 = exact"
LAYER_ORDER = {"cut": 0, "first": 1, "activation": 2}
PLOT_FILES = ("leak_party*_*.png", "norms_party*.png", "cosine_party*.png", "training.png")


def _layer_key(layer: str) -> int:
    return LAYER_ORDER.get(layer, len(LAYER_ORDER))


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def side_knowledge_tag(attack: str, sentence: str) -> str:
    """A few words for a table cell, from the attack's label; report.md has the full sentence."""
    name, _, rest = attack.partition("(")
    params = dict(p.split("=", 1) for p in rest.rstrip(")").split(", ") if "=" in p)
    if params.get("centers") == "oracle":
        return "all labels (oracle)"
    if params.get("centers") == "hint":
        return f"≥{params.get('hints', '?')} labels/class/batch"
    if "k" in params:
        return f"{params['k']} positive{'' if params['k'] == '1' else 's'}/batch"
    known = {"cosine_oracle": "1 positive/batch (oracle)", "cosine_majority": "positives = minority",
             "clustering": "minority / best permutation"}
    if name in known:
        return known[name]
    if re.match(r"none\b", sentence):
        return "none"
    return sentence if len(sentence) <= 28 else sentence[:27] + "…"


def _run_entries(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Run-level entries by party, then layer (cut first), then in the analysis' attack order."""
    entries = [e for e in summary["leak"] if e["scope"] == "run"]
    return sorted(entries, key=lambda e: (e["party_id"], _layer_key(e["layer"])))


def leak_table(summary: dict[str, Any], title: str = "label leakage") -> Table:
    """One row per attack, cut layer then first layer: p95 / mean / max of the flip-corrected
    leak AUC (label accuracy, count error) over the run's batches, and a side-knowledge tag."""
    entries = _run_entries(summary)
    several = len({e["party_id"] for e in entries}) > 1
    table = Table(title=f"{title} (seed {summary.get('seed', '?')})", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=f"per-batch {FLIPPED} ({OTHER_METRICS}) over the run; "
                          "p95 = 95th percentile, Li et al.'s headline. Full side knowledge: report.md")
    for column in ("attack", "p95", "mean", "max", "skipped", "side knowledge"):
        table.add_column(column, justify="left" if column in ("attack", "side knowledge") else "right")
    previous = None
    for e in entries:
        if (e["party_id"], e["layer"]) != previous:
            if previous is not None:
                table.add_section()
            previous = (e["party_id"], e["layer"])
            table.add_row(f"[bold]party {e['party_id']}, {e['layer']} layer[/]" if several
                          else f"[bold]{e['layer']} layer[/]")
        stats = metric_stats(e)
        table.add_row(escape(e["attack"]), *(_fmt(stats.get(k)) for k in ("p95", "mean", "max")),
                      f"{e['skipped']}/{e['batches']}",
                      escape(side_knowledge_tag(e["attack"], e["side_knowledge"])))
    return table


def print_leak_table(console: Console, summary: dict[str, Any]) -> None:
    console.print(leak_table(summary))


def comparison_table(rows: list[tuple[str, dict[str, Any], dict[str, Any]]], layer: str = "cut") -> Table:
    """Runs side by side from (label, summary, utility) triples: utility metrics, then each
    attack's p95 flip-corrected leak AUC at `layer`; changes are against the first run."""
    heads = [headline(summary, layer) for _, summary, _ in rows]
    table = Table(title=f"utility, then p95 leak at the {layer} layer", box=box.SIMPLE_HEAD,
                  caption=f"p95 rows: 95th percentile over batches of the {FLIPPED} ({OTHER_METRICS}). "
                          "(±x) = change against the first column")
    table.add_column("")
    for label, _, _ in rows:
        table.add_column(escape(label), justify="right")
    table.add_row("seed", *(str(summary.get("seed", "?")) for _, summary, _ in rows))
    base = rows[0][2] if rows else {}
    for key in dict.fromkeys(k for _, _, utility_ in rows for k in utility_):
        cells = []
        for i, (_, _, utility_) in enumerate(rows):
            value, first = utility_.get(key), base.get(key)
            delta = i > 0 and isinstance(value, float) and isinstance(first, float)
            cells.append(_fmt(value, 4) + (f" ({value - first:+.4f})" if delta else ""))
        table.add_row(escape(key), *cells)
    table.add_section()
    for attack in dict.fromkeys(a for head in heads for a in head):
        values = (_fmt(h[attack]["p95"]) if attack in h else "-" for h in heads)
        table.add_row(escape(f"p95 {attack}"), *values)
    return table


def _utility(records: list[dict[str, Any]]) -> dict[str, Any]:
    evals = [r for r in records if r.get("type") == "eval"]
    out: dict[str, Any] = {}
    names = {"test_auc": "test AUC", "test_accuracy": "test accuracy", "test_loss": "test loss"}
    for key, name in names.items():
        if evals and evals[-1].get(key) is not None:
            out[name] = float(evals[-1][key])
    out["train steps"] = sum(1 for r in records if r.get("type") == "train")
    return out


def utility(run: RunDir) -> dict[str, Any]:
    """Final test AUC / accuracy / loss and the number of train steps, from metrics.jsonl."""
    return _utility(list(read_metrics(run.metrics)) if run.metrics.exists() else [])


def _bounds(records: list[dict[str, Any]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per party, (steps, Thm-1 AUC bound) of the batches whose defense logged one (the worst if several)."""
    found: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for r in (r for r in records if r.get("type") == "train"):
        for key, diagnostics in r.items():
            if key.startswith("defense.") and isinstance(diagnostics, dict):
                values = [v for k, v in diagnostics.items() if k.endswith("auc_bound") and v is not None]
                if values:
                    found[int(key.removeprefix("defense."))].append((r["step"], max(values)))
    return {party: (np.array([s for s, _ in points]), np.array([v for _, v in points]))
            for party, points in found.items()}


@dataclass
class _Inputs:
    """What the report reads from the run directory; absent files read as empty."""

    config: dict[str, Any]
    config_hash: str
    records: list[dict[str, Any]]
    outcome: dict[str, Any]
    leak: pa.Table | None
    rows: pa.Table | None

    @classmethod
    def read(cls, run: RunDir) -> _Inputs:
        text = run.config.read_text() if run.config.exists() else ""
        found = re.search(r"hash (\w+)", text.partition("\n")[0])
        leak, rows = (run.attacker / name for name in ("leak.parquet", "rows.parquet"))
        return cls(tomllib.loads(text), found.group(1) if found else "unknown",
                   list(read_metrics(run.metrics)) if run.metrics.exists() else [],
                   json.loads(run.outcome.read_text()) if run.outcome.exists() else {},
                   pq.read_table(leak) if leak.exists() else None,
                   pq.read_table(rows) if rows.exists() else None)


def _draw_plots(run: RunDir, summary: dict[str, Any], inputs: _Inputs,
                notes: list[str]) -> list[tuple[str, str]]:
    """Every plot the inputs allow, as (caption, file name); what is missing goes to `notes`."""
    from attacker import plots  # matplotlib only when a report is written

    figures: list[tuple[str, str]] = []

    def figure(name: str, caption: str, draw: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            draw(*args, path=run.report / name, **kwargs)
            figures.append((caption, name))
        except Exception as err:  # noqa: BLE001 - a broken plot must not lose the rest of the report
            log.exception("plot %s failed", name)
            notes.append(f"plot {name} failed: {type(err).__name__}: {err}")

    entries = _run_entries(summary)
    bounds = _bounds(inputs.records)
    row_parties = set(inputs.rows.column("party_id").to_pylist()) if inputs.rows is not None else set()
    if inputs.leak is None:
        notes.append("no attacker/leak.parquet: no leak-over-training plots")
    for party in sorted({e["party_id"] for e in entries}):
        layers = sorted({e["layer"] for e in entries if e["party_id"] == party}, key=_layer_key)
        for layer in layers if inputs.leak is not None else []:
            figure(f"leak_party{party}_{layer}.png", f"Leak over training: party {party}, {layer} layer",
                   plots.leak_over_training, inputs.leak, party, layer, summary.get("seed", "?"),
                   bound=bounds.get(party) if layer == "cut" else None)
        if "first" not in layers:
            notes.append(f"party {party}: no first-layer gradient recorded, so no first-layer leak plot")
        if party not in row_parties:
            notes.append(f"party {party}: no per-row sample in attacker/rows.parquet (written for binary "
                         "runs only), so no norm or cosine histograms")
            continue
        figure(f"norms_party{party}.png", f"Gradient norm by class, early vs late: party {party}",
               plots.class_histograms, inputs.rows, party, "norm", "per-example gradient L2 norm")
        figure(f"cosine_party{party}.png", f"Cosine to an oracle positive by class, early vs late: "
               f"party {party} (the chosen positive itself scores 1)", plots.class_histograms,
               inputs.rows, party, "cosine_oracle", "cosine to one random positive's gradient")
    train = [r for r in inputs.records if r.get("type") == "train"]
    evals = [r for r in inputs.records if r.get("type") == "eval"
             and (r.get("test_auc") is not None or r.get("test_accuracy") is not None)]
    if not inputs.records:
        notes.append("no label_party/metrics.jsonl: no utility table or training curves")
    elif not evals:
        notes.append("no eval records in label_party/metrics.jsonl: no test metric or test-metric plot")
    if train:
        figure("training.png", "Train loss and test metric over training", plots.training_curves,
               train, evals)
    return figures


def write_report(run: RunDir, summary: dict[str, Any]) -> None:
    """Write report/report.md and its PNG plots; a missing input skips a part and says so there."""
    run.report.mkdir(parents=True, exist_ok=True)
    for pattern in PLOT_FILES:  # a plot this report cannot redraw must not outlive it
        for stale in run.report.glob(pattern):
            stale.unlink()
    inputs = _Inputs.read(run)
    notes: list[str] = []
    figures = _draw_plots(run, summary, inputs, notes)
    bounds = _bounds(inputs.records)
    lines = [*_title_md(run, summary, inputs), *_headline_md(summary, inputs.records, bounds),
             *_utility_md(inputs.records), *_objective_md(inputs.config, inputs.outcome),
             *_defense_md(inputs.config, inputs.outcome),
             *_bound_md(bounds, summary), *_leak_md(summary, inputs.leak), *_epoch_md(summary),
             *_side_knowledge_md(summary), "## Warnings", "",
             *(f"- {w}" for w in [*summary.get("warnings", []), *notes] or ["none"]), "", "## Plots", "",
             *(f"### {caption}\n\n![{caption}]({name})\n" for caption, name in figures)]
    text = "\n".join(lines) + "\n"
    write_atomically(run.report / "report.md", lambda tmp: tmp.write_text(text))


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return [*lines, *("| " + " | ".join(row) + " |" for row in rows), ""]


def _title_md(run: RunDir, summary: dict[str, Any], inputs: _Inputs) -> list[str]:
    run_seed = inputs.config.get("run", {}).get("seed", "?")
    analysis_seed = summary.get("seed")
    seeds = f"seed {run_seed}" + (f" (analysis seed {analysis_seed})" if analysis_seed != run_seed else "")
    lines = [f"# Label-leak report: {summary.get('run_id') or run.root.name}", "",
             f"{seeds}; config hash `{inputs.config_hash}`; {summary.get('num_classes', '?')} classes", ""]
    partial = summary.get("partial")
    if partial:
        lines += [f"**Partial run** ({partial['status']}): {partial['train_steps_done']} of "
                  f"{partial['train_steps_planned']} train steps were done; every number below is "
                  "for what was recorded.", ""]
    return lines


def _headline_md(summary: dict[str, Any], records: list[dict[str, Any]],
                 bounds: dict[int, tuple[np.ndarray, np.ndarray]]) -> list[str]:
    head = headline(summary)
    if not head:
        return ["## Headline", "", "No cut-layer leak measured.", ""]
    party = min(e["party_id"] for e in summary["leak"] if e["layer"] == "cut")
    side = {e["attack"]: e["side_knowledge"] for e in summary["leak"]}
    lines = ["## Headline", "", f"Party {party}, cut layer, seed {summary.get('seed')}: p95 over batches "
             f"of the {FLIPPED} ({OTHER_METRICS}).", ""]
    utility_ = {k: v for k, v in _utility(records).items() if k != "train steps"} if records else {}
    if utility_:
        lines += ["Final utility: " + ", ".join(f"{k} {_fmt(v, 4)}" for k, v in utility_.items()) + ".", ""]
    if party in bounds:
        values = bounds[party][1]
        lines += [f"Theorem-1 AUC bound (per batch): mean {_fmt(float(values.mean()))}, "
                  f"p95 {_fmt(float(np.percentile(values, 95)))}.", ""]
    rows = [[a, _fmt(s["p95"]), side_knowledge_tag(a, side[a])] for a, s in head.items()]
    return lines + _md_table(["attack", "p95", "side knowledge"], rows)


def _utility_md(records: list[dict[str, Any]]) -> list[str]:
    if not records:
        return []
    utility_ = _utility(records)
    return ["## Utility", "", "Final evaluation of the label party (label_party/metrics.jsonl).", "",
            *_md_table(list(utility_), [[_fmt(v, 4) for v in utility_.values()]])]


def _objective_md(config: dict[str, Any], outcome: dict[str, Any]) -> list[str]:
    spec = config.get("objective", {"name": "cross_entropy"})
    params = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    lines = ["## Objective", "", f"`{spec.get('name', 'cross_entropy')}`" + (f": {params}" if params else "")
             + " (config.toml; applied before the defense chain).", ""]
    figures = {k: v for k, v in outcome.get("objective", {}).items() if k != "name"}
    if figures:
        lines += ["Run-level summary (label_party/outcome.json):", "",
                  *_md_table(["figure", "value"], [[k, _fmt(v, 4) if isinstance(v, float) else str(v)]
                                                   for k, v in figures.items()])]
    return lines


def _defense_md(config: dict[str, Any], outcome: dict[str, Any]) -> list[str]:
    chain = config.get("defense", [])
    if not chain:
        return ["## Defense", "", "None: the cut-layer gradients were sent unchanged.", ""]
    lines = ["## Defense", "", "Chain, in order (config.toml):", ""]
    for i, spec in enumerate(chain):
        params = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
        lines.append(f"{i + 1}. `{spec.get('name')}`" + (f": {params}" if params else ""))
    rows = []
    for party, chain_summary in sorted(outcome.get("defenses", {}).items()):
        for instances in chain_summary.get("parties", {}).values():
            for d in instances:
                values = ", ".join(f"{k}={_fmt(v, 4)}" for k, v in d.items() if k not in ("position", "name"))
                rows.append([party, str(d.get("position")), d.get("name", "?"), values,
                             str(chain_summary.get("seed", "?"))])
    if not rows:
        return [*lines, "", "No run-level defense summary in label_party/outcome.json.", ""]
    return [*lines, "", "Run-level summary (label_party/outcome.json):", "",
            *_md_table(["party", "position", "defense", "summary", "seed"], rows)]


def _worst_p95(summary: dict[str, Any], party: int, layer: str) -> str:
    entries = [e for e in _run_entries(summary) if e["party_id"] == party and e["layer"] == layer
               and e.get("flipped") and math.isfinite(e["flipped"]["p95"])]
    worst = max(entries, key=lambda e: e["flipped"]["p95"], default=None)
    return f"{_fmt(worst['flipped']['p95'])} ({worst['attack']})" if worst else "not observed"


def _bound_md(bounds: dict[int, tuple[np.ndarray, np.ndarray]], summary: dict[str, Any]) -> list[str]:
    if not bounds:
        return []
    rows = [[str(party), str(values.size), _fmt(float(values.mean())),
             _fmt(float(np.percentile(values, 95))), _fmt(float(values.max())),
             _worst_p95(summary, party, "cut"), _worst_p95(summary, party, "first")]
            for party, (_, values) in sorted(bounds.items())]
    return ["## Theorem-1 AUC bound vs measured leak", "",
            "Per batch, the sumKL Marvell reaches bounds every attack's AUC by 1/2 + √ε/2 − ε/8 under the "
            "Gaussian model it fits (Li et al., Thm 1). Measured = the highest p95 over attacks of the "
            f"{FLIPPED}, with that attack.", "",
            *_md_table(["party", "batches with a bound", "bound mean", "bound p95", "bound max",
                        "measured p95, cut", "measured p95, first"], rows)]


def _leak_md(summary: dict[str, Any], leak: pa.Table | None) -> list[str]:
    lines = ["## Leak per party and layer", "",
             "Per-batch values summarised over the run: mean, p95 (95th percentile, Li et al.'s headline), "
             "max. **raw** = ROC AUC of the attack's score against the labels (below 0.5: the score ranks "
             f"the classes the wrong way round); **flipped** = {FLIPPED} (GAFM).", ""]
    groups: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for e in _run_entries(summary):
        groups[(e["party_id"], e["layer"])].append(e)
    for (party, layer), group in groups.items():
        first = group[0]
        lines += [f"### Party {party}, {layer} layer (seed {first['seed']}, {first['batches']} batches)", ""]
        auc = [e for e in group if e["metric"] == "auc"]
        accuracy = [e for e in group if e["metric"] == "accuracy"]
        counts = [e for e in group if e["metric"] == "count_error"]
        if auc:
            header = [f"{kind} {k}" for kind in ("raw", "flipped") for k in ("mean", "p95", "max")]
            lines += _md_table(["attack", "side knowledge", *header, "skipped"], [
                [e["attack"], side_knowledge_tag(e["attack"], e["side_knowledge"]),
                 *(_fmt(e[kind][k]) for kind in ("raw", "flipped") for k in ("mean", "p95", "max")),
                 f"{e['skipped']}/{e['batches']}"] for e in auc])
        if accuracy:
            lines += _md_table(["attack", "side knowledge", "accuracy mean", "accuracy p95", "accuracy max",
                                "skipped"], [
                [e["attack"], side_knowledge_tag(e["attack"], e["side_knowledge"]),
                 *(_fmt(e["accuracy"][k]) for k in ("mean", "p95", "max")),
                 f"{e['skipped']}/{e['batches']}"] for e in accuracy])
        if counts:
            lines += _md_table(["attack", "side knowledge", "count error mean", "count error p95",
                                "count error max", "skipped"], [
                [e["attack"], side_knowledge_tag(e["attack"], e["side_knowledge"]),
                 *(_fmt(e["count_error"][k]) for k in ("mean", "p95", "max")),
                 f"{e['skipped']}/{e['batches']}"] for e in counts])
        lines += _skip_reasons(leak, party, layer)
    return lines


def _skip_reasons(leak: pa.Table | None, party: int, layer: str) -> list[str]:
    if leak is None:
        return []
    skipped = leak.filter(pc.and_(pc.equal(leak["party_id"], party), pc.equal(leak["layer"], layer)))
    skipped = skipped.filter(pc.is_valid(skipped["skip_reason"]))
    counts = skipped.group_by("skip_reason").aggregate([("step", "count")]).to_pylist()
    if not counts:
        return []
    return ["Skipped (attack, batch) pairs: "
            + "; ".join(f"{c['skip_reason']}: {c['step_count']}" for c in counts) + ".", ""]


def _epoch_md(summary: dict[str, Any]) -> list[str]:
    per: dict[tuple[int, str], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for e in summary["leak"]:
        if e["scope"] == "epoch":
            per[(e["party_id"], e["layer"])][e["attack"]][e["epoch"]] = metric_stats(e).get("p95")
    lines = ["## p95 per epoch", "", f"95th percentile over each epoch's batches of the {FLIPPED} "
             f"({OTHER_METRICS}); seed {summary.get('seed')}.", ""]
    for (party, layer), attacks in sorted(per.items(), key=lambda kv: (kv[0][0], _layer_key(kv[0][1]))):
        epochs = sorted({epoch for values in attacks.values() for epoch in values})
        lines += [f"### Party {party}, {layer} layer", "",
                  *_md_table(["attack", *(f"epoch {ep}" for ep in epochs)],
                             [[a, *(_fmt(v.get(ep)) for ep in epochs)] for a, v in attacks.items()])]
    return lines


def _side_knowledge_md(summary: dict[str, Any]) -> list[str]:
    attacks: dict[str, dict[str, None]] = defaultdict(dict)  # sentence -> its attacks, in order
    for e in _run_entries(summary):
        attacks[e["side_knowledge"]][e["attack"]] = None
    lines = ["## Side knowledge of each attack", "", "As each attack declares it; the tables' short tags "
             "stand for these sentences.", ""]
    lines += [f"- {', '.join(f'`{a}`' for a in names)}: {sentence}" for sentence, names in attacks.items()]
    return [*lines, ""]
