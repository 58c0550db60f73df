"""The leak report: report/report.md with its plots beside it (the terminal's tables: terminal.py)."""

from __future__ import annotations

import errno
import logging
import math
import tomllib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from attacker.analysis.staging import Outputs, locked_outputs
from attacker.analysis.summary import headline, marvell_bounds, metric_stats
from attacker.attacks.exact.report import exact_md
from attacker.attacks.integrity.report import integrity_md
from attacker.attacks.reconstruction.report import (
    grids as reconstruction_grids,
)
from attacker.attacks.reconstruction.report import (
    protection_md,
    reconstruction_md,
)
from attacker.report.cells import (
    FLIPPED,
    OTHER_METRICS,
    layer_key,
    parties_label,
    received_tag,
    run_entries,
    side_knowledge_tag,
    skip_cell,
    spread_cell,
    threat_tag,
)
from attacker.report.leak_read import leak_lines, skip_counts
from attacker.report.threat import above_bound_notes, completion_md, threat_md
from splitleak.artifacts.metrics_log import MetricsLog, read_metrics_log
from splitleak.artifacts.outcome import read_outcome
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.run_config import recorded_hash
from splitleak.config import NetworkConfig, WireConfig
from splitleak.fileio import NO_SPACE
from splitleak.markdown import fmt as _fmt
from splitleak.markdown import fmt_figure
from splitleak.markdown import md_table as _md_table

log = logging.getLogger("attacker.report.report")

MIN_TEST_ROWS = 50  # below: each test row is over 2 points of accuracy
PLOT_FILES = ("leak_party*_*.png", "norms_party*.png", "cosine_party*.png", "training.png",
              "reconstruction_party*.png")


def _utility(metrics: MetricsLog) -> dict[str, Any]:
    evals = metrics.evals
    out: dict[str, Any] = {}
    names = {"test_auc": "test AUC", "test_accuracy": "test accuracy", "test_loss": "test loss"}
    for key, name in names.items():
        if evals and evals[-1].get(key) is not None:
            out[name] = float(evals[-1][key])
    out["train steps"] = metrics.train_steps
    return out


def few_test_rows(metrics: MetricsLog) -> list[str]:
    """A warning when the final evaluation scored fewer than MIN_TEST_ROWS test rows: each row
    then moves the test accuracy by more than 2 points (a probe's AUC came from 2 rows)."""
    evals = [r for r in metrics.evals if r.get("test_rows") is not None]
    rows = int(evals[-1]["test_rows"]) if evals else None
    if rows is None or rows >= MIN_TEST_ROWS:
        return []
    return [f"the utility figures come from {rows} test row(s) (the final evaluation's): one row "
            f"moves the test accuracy by {1 / max(rows, 1):.3g}; give the run more rows or a larger "
            "dataset.test_fraction"]


def utility(run: RunDir) -> dict[str, Any]:
    """Final test AUC / accuracy / loss and the number of train steps, from metrics.jsonl."""
    return _utility(read_metrics_log(run.metrics))


def _bounds(metrics: MetricsLog) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per party, (steps, Thm-1 AUC bound) of the batches whose defense logged one."""
    return {party: (points.steps, points.bounds) for party, points in marvell_bounds(metrics).items()}


@dataclass
class _Inputs:
    """What the report reads from the run directory; absent files read as empty."""

    config: dict[str, Any]
    config_hash: str
    metrics: MetricsLog  # label_party/metrics.jsonl: per-step arrays, its few other records
    outcome: dict[str, Any]
    leak: Path | None  # attacker/leak.parquet, read a row group at a time (leak_read.py)
    rows: pa.Table | None

    @classmethod
    def read(cls, run: RunDir, leak: Path | None = None, rows: Path | None = None) -> _Inputs:
        """The run's inputs, with the leak rows and row sample at `leak` and `rows` (default:
        the run's own)."""
        leak, rows = leak or run.leak, rows or run.leak_rows
        text = run.config.read_text() if run.config.exists() else ""
        return cls(tomllib.loads(text), recorded_hash(run.config) or "unknown",
                   read_metrics_log(run.metrics),
                   read_outcome(run),
                   leak if leak.exists() else None,
                   pq.read_table(rows) if rows.exists() else None)


def _draw_plots(run: RunDir, out: Outputs, summary: dict[str, Any], inputs: _Inputs,
                notes: list[str], failures: list[str]) -> list[tuple[str, str]]:
    """Every plot the inputs allow, drawn in `out.report`, as (caption, file name); what is
    missing goes to `notes`, a plot that failed to `failures`."""
    from attacker.report import plots  # matplotlib only when a report is written

    figures: list[tuple[str, str]] = []

    def figure(name: str, caption: str, draw: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            draw(*args, path=out.report / name, **kwargs)
            figures.append((caption, name))
        except Exception as err:  # noqa: BLE001 - a broken plot must not lose the rest of the report
            if isinstance(err, OSError) and (err.errno in NO_SPACE or err.errno == errno.EROFS):
                raise  # a full or read-only disk: nothing after it can be written either
            log.exception("plot %s failed", name)
            failures.append(f"plot {name} failed: {type(err).__name__}: {err}")

    entries = run_entries(summary)
    bounds = _bounds(inputs.metrics)
    row_parties = set(inputs.rows.column("party_id").to_pylist()) if inputs.rows is not None else set()
    if inputs.leak is None:
        notes.append("no attacker/leak.parquet: no leak-over-training plots")
    # what the run chose not to have is no gap: no first layer without record_first_layer, no
    # per-row sample on a multi-class run
    recorded_first_layer = (inputs.config.get("attacker") or {}).get("record_first_layer", True)
    binary = summary.get("num_classes", 2) == 2 and all(
        r.get("num_classes", 2) == 2 for r in inputs.metrics.plans)

    def leak_plot(leak: Path, party: int, layer: str, path: Path) -> None:
        plots.leak_over_training(leak_lines(leak, party, layer), party, layer, summary.get("seed", "?"),
                                 path=path, bound=bounds.get(party) if layer == "cut" else None)

    for party in sorted({e["party_id"] for e in entries}):
        layers = sorted({e["layer"] for e in entries if e["party_id"] == party}, key=layer_key)
        for layer in layers if inputs.leak is not None else []:
            figure(f"leak_party{party}_{layer}.png", f"Leak over training: party {party}, {layer} layer",
                   leak_plot, inputs.leak, party, layer)
        if "first" not in layers and recorded_first_layer:
            notes.append(f"party {party}: no first-layer gradient recorded, so no first-layer leak plot")
        if party not in row_parties:  # a multi-class run has no per-row sample: no histograms
            if binary:
                notes.append(f"party {party}: no per-row sample in attacker/rows.parquet (written for "
                             "binary runs only), so no norm or cosine histograms")
            continue
        figure(f"norms_party{party}.png", f"Gradient norm by class, early vs late: party {party}",
               plots.class_histograms, inputs.rows, party, "norm", "per-example gradient L2 norm")
        figure(f"cosine_party{party}.png", f"Cosine to an oracle positive by class, early vs late: "
               f"party {party} (the chosen positive itself scores 1)", plots.class_histograms,
               inputs.rows, party, "cosine_oracle", "cosine to one random positive's gradient")
    metrics = inputs.metrics
    evals = [r for r in metrics.evals if r.get("test_auc") is not None or r.get("test_accuracy") is not None]
    if metrics.empty:
        what = "is empty" if run.metrics.exists() else "is missing"
        notes.append(f"label_party/metrics.jsonl {what}: no utility table or training curves")
    elif not evals:
        notes.append("no eval records in label_party/metrics.jsonl: no test metric or test-metric plot")
    if metrics.train_steps:
        figure("training.png", "Train loss and test metric over training", plots.training_curves,
               metrics.steps, metrics.loss, evals)
    for name, caption, victim in reconstruction_grids(run, summary, out.written):
        figure(name, caption, plots.reconstruction_grid, victim)
    return figures


def write_report(run: RunDir, summary: dict[str, Any], out: Outputs | None = None) -> None:
    """Write report/report.md and its PNG plots; a missing input skips a part and says so there.
    What it warns of beyond the analysis (a leak above Marvell's bound, a plot that failed) is
    added to summary["warnings"], so summary.json and the terminal carry it too; what the
    inputs lack (no first-layer log, no rows sample) is said in report.md only. `out`: the
    analysis's staging, whose leak files it reads and where it writes until all are written
    (none: the report replaces the run's at once, under the run's lock: RunInUse while another
    process runs or analyses it); a plot it does not draw again goes then."""
    if out is None:
        with locked_outputs(run) as own:
            write_report(run, summary, own)
            own.commit()
        return
    out.superseded += PLOT_FILES  # a plot this report cannot redraw must not outlive it
    inputs = _Inputs.read(run, *out.reads())
    notes: list[str] = []
    failures: list[str] = []
    figures = _draw_plots(run, out, summary, inputs, notes, failures)
    bounds = _bounds(inputs.metrics)
    summary["warnings"] = list(dict.fromkeys(
        [*above_bound_notes(summary), *summary.get("warnings", []), *few_test_rows(inputs.metrics),
         *failures]))
    warnings = [*summary["warnings"], *notes]
    lines = [*_title_md(run, summary, inputs), *threat_md(summary),
             *_headline_md(summary, inputs.metrics, bounds), *completion_md(summary),
             *exact_md(summary), *reconstruction_md(summary), *integrity_md(summary),
             *protection_md(run, inputs.config),
             *_utility_md(inputs.metrics, bool(summary.get("partial"))),
             *_objective_md(inputs.config, inputs.outcome),
             *_defense_md(inputs.config, inputs.outcome),
             *_bound_md(bounds, summary), *_leak_md(summary, inputs.leak), *_epoch_md(summary),
             *_side_knowledge_md(summary), "## Warnings", "",
             *(f"- {w}" for w in warnings or ["none"]), "", "## Plots", "",
             *(f"### {caption}\n\n![{caption}]({name})\n" for caption, name in figures)]
    text = "\n".join(lines) + "\n"
    (out.report / run.report_md.name).write_text(text)


def _wire_words(config: dict[str, Any]) -> str:
    """`; wire float16, sparse; network 25 ms one-way, 100 Mbit/s` when not the defaults."""
    try:
        wire, network = WireConfig(**config.get("wire", {})), NetworkConfig(**config.get("network", {}))
    except ValueError:
        return ""
    words = ([f"wire {wire.describe()}"] if wire != WireConfig() else []) + (
        [f"network {network.describe()}"] if network.shaped else [])
    return "".join(f"; {w}" for w in words)


def _dataset_file(dataset: dict[str, Any]) -> str:
    """` (FILE)` where the dataset was read from a file the config names, else nothing."""
    path = (dataset.get("params") or {}).get("path")
    return f" (`{path}`)" if isinstance(path, str) and path else ""


def _title_md(run: RunDir, summary: dict[str, Any], inputs: _Inputs) -> list[str]:
    run_seed = inputs.config.get("run", {}).get("seed", "?")
    analysis_seed = summary.get("seed")
    seeds = f"seed {run_seed}" + (f" (analysis seed {analysis_seed})" if analysis_seed != run_seed else "")
    dataset = inputs.config.get("dataset", {})
    lines = [f"# Label-leak report: {summary.get('run_id') or run.root.name}", "",
             f"dataset `{dataset.get('name', '?')}`{_dataset_file(dataset)}; {seeds}; config hash "
             f"`{inputs.config_hash}`; {summary.get('num_classes', '?')} classes"
             + _wire_words(inputs.config), ""]
    partial = summary.get("partial")
    if partial and partial["status"] == "ok":  # finished, but its metrics.jsonl cut short
        lines += [f"**Partial run** (label_party/metrics.jsonl cut short): it holds "
                  f"{partial['train_steps_done']} of the {partial['train_steps_planned']} train "
                  "steps done; its last evaluation is not the final one.", ""]
    elif partial:
        lines += [f"**Partial run** ({partial['status']}): {partial['train_steps_done']} of "
                  f"{partial['train_steps_planned']} train steps were done; every number below is "
                  "for what was recorded.", ""]
    return lines


def _headline_md(summary: dict[str, Any], metrics: MetricsLog,
                 bounds: dict[int, tuple[np.ndarray, np.ndarray]]) -> list[str]:
    head = headline(summary)
    if not head:
        return ["## Headline", "", "No cut-layer leak measured.", ""]
    party = min(e["party_id"] for e in summary["leak"] if e["layer"] == "cut")
    entry = {e["attack"]: e for e in run_entries(summary) if e["party_id"] == party
             and e["layer"] == "cut" and len(e.get("parties") or [party]) == 1}
    threat = next(iter(entry.values())).get("threat") or "not recorded"
    lines = ["## Headline", "", f"Party {party} ({threat}), cut layer, seed {summary.get('seed')}: p95 over "
             f"batches of the {FLIPPED} (label attacks: not a p95 but the label accuracy pooled "
             "over rows; count attacks: the mean count error Σ|n̂ − n|/2B, 0 = exact); ± = its "
             "standard deviation over the draws of random side knowledge.", ""]
    utility_ = {k: v for k, v in _utility(metrics).items() if k != "train steps"} if not metrics.empty else {}
    if utility_:
        which = "Utility at the last evaluation recorded" if summary.get("partial") else "Final utility"
        lines += [f"{which}: " + ", ".join(f"{k} {_fmt(v, 4)}" for k, v in utility_.items()) + ".", ""]
    if party in bounds:
        values = bounds[party][1]
        lines += [f"Theorem-1 AUC bound (per batch): mean {_fmt(float(values.mean()))}, "
                  f"p95 {_fmt(float(np.percentile(values, 95)))}.", ""]
    rows = [[a, _fmt(s["value"]), spread_cell(entry[a]) or "-", threat_tag(entry[a]),
             side_knowledge_tag(a, entry[a]["side_knowledge"])] for a, s in head.items()]
    return lines + _md_table(["attack", "p95", "±", "threat", "side knowledge"], rows)


def _utility_md(metrics: MetricsLog, partial: bool) -> list[str]:
    if metrics.empty:
        return []
    utility_ = _utility(metrics)
    which = "Last evaluation recorded (a partial run)" if partial else "Final evaluation"
    return ["## Utility", "", f"{which} of the label party (label_party/metrics.jsonl).", "",
            *_md_table(list(utility_), [[_fmt(v, 4) for v in utility_.values()]]), *_pace_md(metrics)]


def _pace_md(metrics: MetricsLog) -> list[str]:
    step, seconds = metrics.ms_per_step, metrics.trained_seconds
    if step is None or seconds is None:
        return []
    resumed = "" if not metrics.resumes else (
        f"; resumed {metrics.resumes} time(s): the whole run, each part's time summed, the time "
        "between them and the steps redone after a checkpoint not counted")
    return [f"Pace: median train step {step:.1f} ms; training took {seconds:.1f} s "
            f"(label party's clock, evaluation passes included{resumed}; `splitleak compare` "
            "gives the time to a target utility).", ""]


def _objective_md(config: dict[str, Any], outcome: dict[str, Any]) -> list[str]:
    spec = config.get("objective", {"name": "cross_entropy"})
    params = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    lines = ["## Objective", "", f"`{spec.get('name', 'cross_entropy')}`" + (f": {params}" if params else "")
             + " (config.toml; applied before the defense chain).", ""]
    figures = {k: v for k, v in outcome.get("objective", {}).items() if k != "name"}
    if figures:
        lines += ["Run-level summary (label_party/outcome.json):", "",
                  *_md_table(["figure", "value"], [[k, fmt_figure(v)] for k, v in figures.items()])]
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
                values = ", ".join(f"{k}={fmt_figure(v)}" for k, v in d.items()
                                   if k not in ("position", "name"))
                rows.append([party, str(d.get("position")), d.get("name", "?"), values,
                             str(chain_summary.get("seed", "?"))])
    if not rows:
        return [*lines, "", "No run-level defense summary in label_party/outcome.json.", ""]
    return [*lines, "", "Run-level summary (label_party/outcome.json):", "",
            *_md_table(["party", "position", "defense", "summary", "seed"], rows)]


def _worst_p95(summary: dict[str, Any], party: int, layer: str) -> str:
    entries = [e for e in run_entries(summary) if e["party_id"] == party and e["layer"] == layer
               and e.get("flipped") and math.isfinite(e["flipped"]["p95"])
               and not e.get("sees_scored_label")]
    worst = max(entries, key=lambda e: e["flipped"]["p95"], default=None)
    return f"{_fmt(worst['flipped']['p95'])} ({worst['attack']})" if worst else "not observed"


def _bound_md(bounds: dict[int, tuple[np.ndarray, np.ndarray]], summary: dict[str, Any]) -> list[str]:
    if not bounds:
        return []
    rows = [[str(party), str(values.size), _fmt(float(values.mean())),
             _fmt(float(np.percentile(values, 95))), _fmt(float(values.max())),
             _worst_p95(summary, party, "cut"), _worst_p95(summary, party, "first")]
            for party, (_, values) in sorted(bounds.items())]
    above = [[str(a["party_id"]), a["attack"], f"{a['above']}/{a['batches']}", _fmt(a["max_excess"]),
              _fmt(a["mean_excess"])] for a in summary.get("above_bound", [])]
    outside = sorted({e["attack"] for e in summary.get("leak", []) if e.get("sees_scored_label")})
    return ["## Theorem-1 AUC bound vs measured leak", "",
            "Per batch, the sumKL Marvell reaches bounds every attack's AUC by 1/2 + √ε/2 − ε/8 under the "
            "Gaussian model it fits (Li et al., Thm 1). Measured = the highest p95 over attacks of the "
            f"{FLIPPED}, with that attack."
            + (f" Not compared: {', '.join(outside)}, whose score of a row reads that row's own label "
               "(an upper bound; the theorem bounds what the gradient alone reveals)." if outside else ""),
            "",
            *_md_table(["party", "batches with a bound", "bound mean", "bound p95", "bound max",
                        "measured p95, cut", "measured p95, first"], rows),
            *(["Batches whose measured leak AUC (cut layer, flip-corrected, mean over draws) exceeds "
               "that batch's bound (see Warnings for why this can happen):", "",
               *_md_table(["party", "attack", "batches above", "max excess", "mean excess"], above)]
              if above else ["No batch's measured leak exceeds its bound.", ""])]


def _leak_md(summary: dict[str, Any], leak: Path | None) -> list[str]:
    lines = ["## Leak per party and layer", "",
             "Per-batch values summarised over the run: mean, p95 (95th percentile, Li et al.'s headline), "
             "max. **raw** = ROC AUC of the attack's score against the labels (below 0.5: the score ranks "
             f"the classes the wrong way round); **flipped** = {FLIPPED} (GAFM).", ""]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in run_entries(summary):
        groups[(parties_label(e), e["layer"])].append(e)
    for (who, layer), group in groups.items():
        first = group[0]
        lines += [f"### Party {who}, {layer} layer (seed {first['seed']}, {first['batches']} batches)", "",
                  f"Threat model: {first.get('threat') or 'not recorded'}.", ""]
        auc = [e for e in group if e["metric"] == "auc"]
        accuracy = [e for e in group if e["metric"] == "accuracy"]
        counts = [e for e in group if e["metric"] == "count_error"]
        if auc:
            header = [f"{kind} {k}" for kind in ("raw", "flipped") for k in ("mean", "p95", "max")]
            lines += _md_table(["attack", "side knowledge", *header, "± flipped p95", "skipped",
                                "threshold accuracy mean"], [
                [e["attack"], received_tag(e, side_knowledge_tag(e["attack"], e["side_knowledge"])),
                 *(_fmt(e[kind][k]) for kind in ("raw", "flipped") for k in ("mean", "p95", "max")),
                 spread_cell(e) or "-", skip_cell(e),
                 _fmt((e.get("threshold_accuracy") or {}).get("mean"))] for e in auc])
            rules = dict.fromkeys(e["threshold_rule"] for e in auc if e.get("threshold_rule"))
            if rules:
                lines += ["Threshold accuracy: the share of a batch's scored rows a hard rule on the "
                          "scores labels right, mean over batches (VFLAIR's attack performance for "
                          "its DCS); rules: " + "; ".join(
                              f"{', '.join(e['attack'] for e in auc if e.get('threshold_rule') == r)}: {r}"
                              for r in rules) + ".", ""]
        if accuracy:
            lines += _md_table(["attack", "side knowledge", "pooled accuracy", "rows", "no prediction",
                                "batch mean", "batch p95", "batch max", "skipped"], [
                [e["attack"], side_knowledge_tag(e["attack"], e["side_knowledge"]),
                 _fmt(e.get("pooled", {}).get("accuracy")), str(e.get("pooled", {}).get("rows", "?")),
                 str(e.get("pooled", {}).get("no_prediction", "?")),
                 *(_fmt(e["accuracy"][k]) for k in ("mean", "p95", "max")), skip_cell(e)]
                for e in accuracy])
        if counts:
            lines += _md_table(["attack", "side knowledge", "count error mean", "count error p95",
                                "count error max", "skipped"], [
                [e["attack"], side_knowledge_tag(e["attack"], e["side_knowledge"]),
                 *(_fmt(e["count_error"][k]) for k in ("mean", "p95", "max")),
                 skip_cell(e)] for e in counts])
        lines += [f"Not applicable, never scored: `{e['attack']}`: {e['premise']}." for e in group
                  if e.get("premise")]
        lines += _skip_reasons(leak, who, layer)
    if any(e.get("degenerate") for e in run_entries(summary)):
        lines += ["(n tied) = batches skipped as degenerate: every score tied (e.g. both class medians "
                  "the zero vector), which carries no information and is never scored 0.5.", ""]
    return lines


def _skip_reasons(leak: Path | None, who: str, layer: str) -> list[str]:
    counts = skip_counts(leak, who, layer) if leak is not None else {}
    if not counts:
        return []
    return ["Skipped (attack, batch) pairs: "
            + "; ".join(f"{reason}: {count}" for reason, count in counts.items()) + ".", ""]


def _epoch_md(summary: dict[str, Any]) -> list[str]:
    per: dict[tuple[str, str], dict[str, dict[int, float | None]]] = defaultdict(lambda: defaultdict(dict))
    for e in summary["leak"]:
        if e["scope"] == "epoch":
            per[(parties_label(e), e["layer"])][e["attack"]][e["epoch"]] = metric_stats(e).get("p95")
    lines = ["## p95 per epoch", "", f"95th percentile over each epoch's batches of the {FLIPPED} "
             f"({OTHER_METRICS}); seed {summary.get('seed')}.", ""]
    for (party, layer), attacks in sorted(per.items(), key=lambda kv: (len(kv[0][0]), kv[0][0],
                                                                       layer_key(kv[0][1]))):
        epochs = sorted({epoch for values in attacks.values() for epoch in values})
        lines += [f"### Party {party}, {layer} layer", "",
                  *_md_table(["attack", *(f"epoch {ep}" for ep in epochs)],
                             [[a, *(_fmt(v.get(ep)) for ep in epochs)] for a, v in attacks.items()])]
    return lines


def _side_knowledge_md(summary: dict[str, Any]) -> list[str]:
    attacks: dict[str, dict[str, None]] = defaultdict(dict)  # sentence -> its attacks, in order
    for e in run_entries(summary) + run_entries(summary, completion=True):
        attacks[e["side_knowledge"]][e["attack"]] = None
    lines = ["## Side knowledge of each attack", "", "As each attack declares it; the tables' short tags "
             "stand for these sentences.", ""]
    lines += [f"- {', '.join(f'`{a}`' for a in names)}: {sentence}" for sentence, names in attacks.items()]
    return [*lines, ""]
