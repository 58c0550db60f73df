"""The leak report: compact tables in the terminal, report/report.md with its plots beside it."""

from __future__ import annotations

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

from attacker.analysis.summary import headline, headline_value, marvell_bounds, metric_stats
from attacker.attacks.exact.report import exact_md, exact_table
from attacker.attacks.integrity.report import integrity_md, integrity_table
from attacker.attacks.reconstruction.report import (
    grids as reconstruction_grids,
)
from attacker.attacks.reconstruction.report import (
    protection_md,
    reconstruction_md,
    reconstruction_table,
)
from attacker.report.threat import above_bound_notes, completion_md, threat_md
from splitleak.artifacts.metrics import read_metrics
from splitleak.artifacts.outcome import read_outcome
from splitleak.artifacts.paths import RunDir
from splitleak.config import NetworkConfig, WireConfig
from splitleak.fileio import write_atomically
from splitleak.markdown import figure
from splitleak.markdown import fmt as _fmt
from splitleak.markdown import md_table as _md_table
from splitleak.pace import ms_per_step

log = logging.getLogger("attacker.report.report")

FLIPPED = "flip-corrected leak AUC max(AUC, 1 − AUC)"
OTHER_METRICS = "label attacks: label accuracy; count attacks: count error Σ|n̂ − n|/2B, 0 = exact"
LAYER_ORDER = {"cut": 0, "first": 1, "activation": 2}
PLOT_FILES = ("leak_party*_*.png", "norms_party*.png", "cosine_party*.png", "training.png",
              "reconstruction_party*.png")


def _layer_key(layer: str) -> int:
    return LAYER_ORDER.get(layer, len(LAYER_ORDER))


def side_knowledge_tag(attack: str, sentence: str) -> str:
    """A few words for a table cell, from the attack's label; report.md has the full sentence."""
    name, _, rest = attack.partition("(")
    params = dict(p.split("=", 1) for p in rest.rstrip(")").split(", ") if "=" in p)
    if params.get("centers") == "oracle":
        return "all labels (oracle)"
    if params.get("centers") == "oracle_loo":
        return "all other labels (oracle)"
    if params.get("centers") == "hint":
        return f"≥{params.get('hints', '?')} labels/class/batch"
    if "k" in params:
        return f"{params['k']} positive{'' if params['k'] == '1' else 's'}/batch"
    known = {"cosine_oracle": "1 clean positive/batch", "cosine_majority": "positives = minority",
             "clustering": "minority / best permutation",
             "model_completion": f"own bottom, {params.get('labelled_per_class', '?')} labelled/class"}
    if name in known:
        return known[name]
    if re.match(r"none\b", sentence):
        return "none"
    return sentence if len(sentence) <= 28 else sentence[:27] + "…"


def _who(entry: dict[str, Any]) -> str:
    """"1", or "1+2" for a colluding group."""
    return "+".join(map(str, entry.get("parties") or [entry["party_id"]]))


def _run_entries(summary: dict[str, Any], completion: bool = False) -> list[dict[str, Any]]:
    """Run-level gradient-attack entries (or, with `completion`, the model-completion ones) by
    party, then layer (cut first), then in the analysis' attack order."""
    entries = [e for e in summary["leak"] if e["scope"] == "run" and "exact" not in e
               and e["layer"] not in ("input", "output")
               and ("completion" in e or "error" in e) == completion]
    return sorted(entries, key=lambda e: (len(e.get("parties") or [1]), e["party_id"],
                                          _layer_key(e["layer"])))


def threat_tag(entry: dict[str, Any]) -> str:
    """A word or two for a table cell: curious / malicious / colluding; report.md has the rest."""
    if len(entry.get("parties") or [1]) > 1:
        return f"colluding {_who(entry)}"
    threat = entry.get("threat") or ""
    return "malicious" if "malicious" in threat else "curious" if threat else "not recorded"


def _spread_cell(entry: dict[str, Any], stat: str = "p95") -> str:
    spread = ((entry.get("spread") or {}).get("flipped") or {}).get(stat)  # None: every batch skipped
    return f"±{spread['std']:.3f}" if spread and spread.get("std") is not None and math.isfinite(
        spread["std"]) else ""


def _received(entry: dict[str, Any], tag: str) -> str:
    """An anchor attack's tag, saying when some anchors were received rows, not clean ones."""
    received = entry.get("received_anchors") or 0
    return f"{tag}; {received} received" if received else tag


def _skip_cell(entry: dict[str, Any]) -> str:
    degenerate = entry.get("degenerate") or 0
    return f"{entry['skipped']}/{entry['batches']}" + (f" ({degenerate} tied)" if degenerate else "")


# The terminal's side-knowledge tags, short enough for 80 columns; the caption's legend says what
# they mean and report.md has the full sentences.
_COMPACT_TAGS = ((r"^1 clean positive/batch$", "clean pos."), (r"^(\d+) positives?/batch$", r"\1 pos."),
                 (r"^≥(\d+) labels/class/batch$", r"≥\1/class"), (r"^all labels \(oracle\)$", "oracle"),
                 (r"^all other labels \(oracle\)$", "oracle−own"),
                 (r"^positives = minority$", "minority"), (r"^minority / best permutation$", "minority+perm"),
                 (r"^own bottom, (\S+) labelled/class$", r"\1 lab./class"))
TAG_LEGEND = ("side knowledge per batch: k pos. = k known positives; clean pos. = one pre-defense "
              "positive gradient; ≥h/class = h known labels of each class; oracle = every label; "
              "oracle−own = every label but the scored row's; minority = positives are the "
              "minority class (+perm: best label permutation)")


def compact_tag(attack: str, sentence: str) -> str:
    """The side-knowledge tag in a few characters, for the terminal (legend: TAG_LEGEND)."""
    tag = side_knowledge_tag(attack, sentence)
    for pattern, short in _COMPACT_TAGS:
        if re.match(pattern, tag):
            return re.sub(pattern, short, tag)
    return tag


def leak_table(summary: dict[str, Any], title: str = "label leakage") -> Table:
    """One row per attack, cut layer then first layer: p95 and mean of the flip-corrected leak AUC
    over the run's batches (label attacks: pooled accuracy, then the per-batch mean; count attacks:
    count error), the spread over draws of random side knowledge, and the side knowledge; each
    section's heading names the attacking party and its threat model. Fits 80 columns."""
    entries = _run_entries(summary)
    draws = summary.get("draws")
    table = Table(title=f"{title} (seed {summary.get('seed', '?')})", box=box.SIMPLE_HEAD, show_edge=False,
                  collapse_padding=True,
                  caption=f"per-batch {FLIPPED} over the run; p95 = 95th percentile, Li et al.'s headline "
                          "(label attacks: not a p95 but the accuracy pooled over rows; count attacks: "
                          f"the mean count error, 0 = exact). ± = std of p95 over {draws or 'R'} draws "
                          f"of random side knowledge. {TAG_LEGEND}. Max, full threat model: report.md")
    width = max((len(e["attack"]) for e in entries), default=6)
    table.add_column("attack", no_wrap=True, min_width=width)
    for column in ("p95", "mean", "±", "skipped"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("knows", overflow="fold")
    previous = None
    for e in entries:
        if (_who(e), e["layer"]) != previous:
            if previous is not None:
                table.add_section()
            previous = (_who(e), e["layer"])
            table.add_row(f"[bold]{e['layer']} layer, party {_who(e)} ({escape(threat_tag(e))})[/]")
        stats = metric_stats(e)
        knows = "not applicable (report.md)" if e.get("premise") else \
            _received(e, compact_tag(e["attack"], e["side_knowledge"]))
        table.add_row(escape(e["attack"]), _fmt(headline_value(e)),
                      _fmt(stats.get("mean")), _spread_cell(e), f"{e['skipped']}/{e['batches']}",
                      escape(knows))
    return table


def completion_table(summary: dict[str, Any]) -> Table | None:
    """Model completion per attacker: top-1 (top-5) on train and test rows, and both baselines."""
    entries = sorted(_run_entries(summary, completion=True), key=lambda e: bool(e.get("diagnostic")))
    if not entries:
        return None
    table = Table(title="model completion (label inference accuracy pooled over rows)",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True,
                  caption="train rows exclude the labelled ones; (top-5); baselines train/test: the "
                          "same head on the labelled rows alone, and MixMatch on a random bottom; "
                          "diag. = a diagnostic (bottom frozen), not the papers' comparable figure")
    for column in ("attacker", "labelled", "train", "test", "labelled\nonly", "random\nbottom"):
        table.add_column(column, justify="left" if column == "attacker" else "right", no_wrap=True)
    for e in entries:
        who = escape(f"{_who(e)} {threat_tag(e)}" + (" diag." if e.get("diagnostic") else ""))
        if "error" in e:
            table.add_row(who, "-", f"[red]{escape(e['error'])}[/]")
            continue
        c = e["completion"]
        base = c.get("baselines", {})
        table.add_row(who, str(c["labelled"]), _top_cell(c["train"]), _top_cell(c["test"]),
                      *(f"{_fmt(base[b]['train']['top1'])}/{_fmt(base[b]['test']['top1'])}"
                        if b in base else "-" for b in ("labelled_only", "random_bottom")))
    return table


def _top_cell(split: dict[str, Any]) -> str:
    """Top-1, and top-5 in brackets when the task has ten or more classes."""
    top5 = split.get("top5")
    return _fmt(split["top1"]) + (f" ({_fmt(top5)})" if top5 is not None else "")


def print_warnings(console: Console, summary: dict[str, Any]) -> None:
    """The analysis's warnings, as written (brackets in them are text, not markup)."""
    for warning in summary["warnings"]:
        console.print(f"[yellow]warning:[/] {escape(warning)}")


def print_leak_table(console: Console, summary: dict[str, Any]) -> None:
    """The gradient attacks' table, then the run-level attacks' (an empty first table is left
    out when a run-level one follows, e.g. a run analysed with EXACT alone)."""
    run_level = [t for t in (completion_table(summary), exact_table(summary),
                             reconstruction_table(summary), integrity_table(summary))
                 if t is not None]
    if _run_entries(summary) or not run_level:
        console.print(leak_table(summary))
    for table in run_level:
        console.print(table)


def _with_change(value: Any, first: Any, digits: int, show: bool) -> str:
    """A cell with its change against the first column's value, when both are numbers."""
    change = show and isinstance(value, float) and isinstance(first, float)
    return _fmt(value, digits) + (f" ({value - first:+.{digits}f})" if change else "")


def comparison_table(rows: list[tuple[str, dict[str, Any], dict[str, Any]]],
                     layers: tuple[str, ...] = ("cut", "first")) -> Table:
    """Runs side by side from (label, summary, utility) triples: utility metrics, then per layer
    each attack's headline leak (p95 of the flip-corrected AUC; pooled accuracy; count error),
    every cell after the first column with its change against the first column."""
    table = Table(title="side by side: utility, then p95 leak per layer", box=box.SIMPLE_HEAD,
                  caption=f"leak rows: 95th percentile over batches of the {FLIPPED} ({OTHER_METRICS}; "
                          "label accuracy pooled over rows). (±x) = change against the first column")
    heads = {layer: [headline(summary, layer) for _, summary, _ in rows] for layer in layers}
    names = [a for layer in layers for head in heads[layer] for a in head]
    table.add_column("", no_wrap=True, min_width=max(map(len, names), default=0))
    for label, _, _ in rows:
        table.add_column(escape(label), justify="right", no_wrap=True)
    table.add_row("seed", *(str(summary.get("seed", "?")) for _, summary, _ in rows))
    base = rows[0][2] if rows else {}
    for key in dict.fromkeys(k for _, _, utility_ in rows for k in utility_):
        table.add_row(escape(key), *(_with_change(u.get(key), base.get(key), 4, i > 0)
                                     for i, (_, _, u) in enumerate(rows)))
    for layer in layers:
        if not any(heads[layer]):
            continue
        table.add_section()
        table.add_row(f"[bold]{layer} layer[/]")
        first = heads[layer][0]
        for attack in dict.fromkeys(a for head in heads[layer] for a in head):
            table.add_row(escape(attack), *(
                _with_change(h[attack]["value"], first.get(attack, {}).get("value"), 3, i > 0)
                if attack in h else "-" for i, h in enumerate(heads[layer])))
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
    """Per party, (steps, Thm-1 AUC bound) of the batches whose defense logged one."""
    return {party: (np.array(list(points)), np.array(list(points.values())))
            for party, points in marvell_bounds(records).items()}


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
        leak, rows = run.leak, run.leak_rows
        return cls(tomllib.loads(text), found.group(1) if found else "unknown",
                   list(read_metrics(run.metrics)) if run.metrics.exists() else [],
                   read_outcome(run),
                   pq.read_table(leak) if leak.exists() else None,
                   pq.read_table(rows) if rows.exists() else None)


def _draw_plots(run: RunDir, summary: dict[str, Any], inputs: _Inputs, notes: list[str],
                failures: list[str]) -> list[tuple[str, str]]:
    """Every plot the inputs allow, as (caption, file name); what is missing goes to `notes`,
    a plot that failed to `failures`."""
    from attacker.report import plots  # matplotlib only when a report is written

    figures: list[tuple[str, str]] = []

    def figure(name: str, caption: str, draw: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            draw(*args, path=run.report / name, **kwargs)
            figures.append((caption, name))
        except Exception as err:  # noqa: BLE001 - a broken plot must not lose the rest of the report
            log.exception("plot %s failed", name)
            failures.append(f"plot {name} failed: {type(err).__name__}: {err}")

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
    for name, caption, victim in reconstruction_grids(run, summary):
        figure(name, caption, plots.reconstruction_grid, victim)
    return figures


def write_report(run: RunDir, summary: dict[str, Any]) -> None:
    """Write report/report.md and its PNG plots; a missing input skips a part and says so there.
    What it warns of beyond the analysis (a leak above Marvell's bound, a plot that failed) is
    added to summary["warnings"], so summary.json and the terminal carry it too; what the
    inputs lack (no first-layer log, no rows sample) is said in report.md only."""
    run.report.mkdir(parents=True, exist_ok=True)
    for pattern in PLOT_FILES:  # a plot this report cannot redraw must not outlive it
        for stale in run.report.glob(pattern):
            stale.unlink()
    inputs = _Inputs.read(run)
    notes: list[str] = []
    failures: list[str] = []
    figures = _draw_plots(run, summary, inputs, notes, failures)
    bounds = _bounds(inputs.records)
    summary["warnings"] = list(dict.fromkeys(
        [*above_bound_notes(summary), *summary.get("warnings", []), *failures]))
    warnings = [*summary["warnings"], *notes]
    lines = [*_title_md(run, summary, inputs), *threat_md(summary),
             *_headline_md(summary, inputs.records, bounds), *completion_md(summary),
             *exact_md(summary), *reconstruction_md(summary), *integrity_md(summary),
             *protection_md(run, inputs.config),
             *_utility_md(inputs.records), *_objective_md(inputs.config, inputs.outcome),
             *_defense_md(inputs.config, inputs.outcome),
             *_bound_md(bounds, summary), *_leak_md(summary, inputs.leak), *_epoch_md(summary),
             *_side_knowledge_md(summary), "## Warnings", "",
             *(f"- {w}" for w in warnings or ["none"]), "", "## Plots", "",
             *(f"### {caption}\n\n![{caption}]({name})\n" for caption, name in figures)]
    text = "\n".join(lines) + "\n"
    write_atomically(run.report_md, lambda tmp: tmp.write_text(text))


def _wire_words(config: dict[str, Any]) -> str:
    """`; wire float16, sparse; network 25 ms one-way, 100 Mbit/s` when not the defaults."""
    try:
        wire, network = WireConfig(**config.get("wire", {})), NetworkConfig(**config.get("network", {}))
    except ValueError:
        return ""
    words = ([f"wire {wire.describe()}"] if wire != WireConfig() else []) + (
        [f"network {network.describe()}"] if network.shaped else [])
    return "".join(f"; {w}" for w in words)


def _title_md(run: RunDir, summary: dict[str, Any], inputs: _Inputs) -> list[str]:
    run_seed = inputs.config.get("run", {}).get("seed", "?")
    analysis_seed = summary.get("seed")
    seeds = f"seed {run_seed}" + (f" (analysis seed {analysis_seed})" if analysis_seed != run_seed else "")
    lines = [f"# Label-leak report: {summary.get('run_id') or run.root.name}", "",
             f"{seeds}; config hash `{inputs.config_hash}`; {summary.get('num_classes', '?')} classes"
             + _wire_words(inputs.config), ""]
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
    entry = {e["attack"]: e for e in _run_entries(summary) if e["party_id"] == party
             and e["layer"] == "cut" and len(e.get("parties") or [party]) == 1}
    threat = next(iter(entry.values())).get("threat") or "not recorded"
    lines = ["## Headline", "", f"Party {party} ({threat}), cut layer, seed {summary.get('seed')}: p95 over "
             f"batches of the {FLIPPED} ({OTHER_METRICS}; label attacks: the accuracy pooled over "
             "rows; count attacks: the mean count error); ± = its "
             "standard deviation over the draws of random side knowledge.", ""]
    utility_ = {k: v for k, v in _utility(records).items() if k != "train steps"} if records else {}
    if utility_:
        lines += ["Final utility: " + ", ".join(f"{k} {_fmt(v, 4)}" for k, v in utility_.items()) + ".", ""]
    if party in bounds:
        values = bounds[party][1]
        lines += [f"Theorem-1 AUC bound (per batch): mean {_fmt(float(values.mean()))}, "
                  f"p95 {_fmt(float(np.percentile(values, 95)))}.", ""]
    rows = [[a, _fmt(s["value"]), _spread_cell(entry[a]) or "-", threat_tag(entry[a]),
             side_knowledge_tag(a, entry[a]["side_knowledge"])] for a, s in head.items()]
    return lines + _md_table(["attack", "p95", "±", "threat", "side knowledge"], rows)


def _utility_md(records: list[dict[str, Any]]) -> list[str]:
    if not records:
        return []
    utility_ = _utility(records)
    return ["## Utility", "", "Final evaluation of the label party (label_party/metrics.jsonl).", "",
            *_md_table(list(utility_), [[_fmt(v, 4) for v in utility_.values()]]), *_pace_md(records)]


def _pace_md(records: list[dict[str, Any]]) -> list[str]:
    step = ms_per_step(records)
    walls = [r["wall"] for r in records if r.get("type") in ("train", "eval")
             and isinstance(r.get("wall"), int | float)]
    if step is None or not walls:
        return []
    return [f"Pace: median train step {step:.1f} ms; training took {max(walls):.1f} s "
            "(label party's clock, evaluation passes included; `splitleak compare` gives the time "
            "to a target utility).", ""]


def _objective_md(config: dict[str, Any], outcome: dict[str, Any]) -> list[str]:
    spec = config.get("objective", {"name": "cross_entropy"})
    params = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    lines = ["## Objective", "", f"`{spec.get('name', 'cross_entropy')}`" + (f": {params}" if params else "")
             + " (config.toml; applied before the defense chain).", ""]
    figures = {k: v for k, v in outcome.get("objective", {}).items() if k != "name"}
    if figures:
        lines += ["Run-level summary (label_party/outcome.json):", "",
                  *_md_table(["figure", "value"], [[k, figure(v)] for k, v in figures.items()])]
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
                values = ", ".join(f"{k}={figure(v)}" for k, v in d.items() if k not in ("position", "name"))
                rows.append([party, str(d.get("position")), d.get("name", "?"), values,
                             str(chain_summary.get("seed", "?"))])
    if not rows:
        return [*lines, "", "No run-level defense summary in label_party/outcome.json.", ""]
    return [*lines, "", "Run-level summary (label_party/outcome.json):", "",
            *_md_table(["party", "position", "defense", "summary", "seed"], rows)]


def _worst_p95(summary: dict[str, Any], party: int, layer: str) -> str:
    entries = [e for e in _run_entries(summary) if e["party_id"] == party and e["layer"] == layer
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


def _leak_md(summary: dict[str, Any], leak: pa.Table | None) -> list[str]:
    lines = ["## Leak per party and layer", "",
             "Per-batch values summarised over the run: mean, p95 (95th percentile, Li et al.'s headline), "
             "max. **raw** = ROC AUC of the attack's score against the labels (below 0.5: the score ranks "
             f"the classes the wrong way round); **flipped** = {FLIPPED} (GAFM).", ""]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in _run_entries(summary):
        groups[(_who(e), e["layer"])].append(e)
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
                [e["attack"], _received(e, side_knowledge_tag(e["attack"], e["side_knowledge"])),
                 *(_fmt(e[kind][k]) for kind in ("raw", "flipped") for k in ("mean", "p95", "max")),
                 _spread_cell(e) or "-", _skip_cell(e),
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
                 *(_fmt(e["accuracy"][k]) for k in ("mean", "p95", "max")), _skip_cell(e)]
                for e in accuracy])
        if counts:
            lines += _md_table(["attack", "side knowledge", "count error mean", "count error p95",
                                "count error max", "skipped"], [
                [e["attack"], side_knowledge_tag(e["attack"], e["side_knowledge"]),
                 *(_fmt(e["count_error"][k]) for k in ("mean", "p95", "max")),
                 _skip_cell(e)] for e in counts])
        lines += [f"Not applicable, never scored: `{e['attack']}`: {e['premise']}." for e in group
                  if e.get("premise")]
        lines += _skip_reasons(leak, who, layer)
    if any(e.get("degenerate") for e in _run_entries(summary)):
        lines += ["(n tied) = batches skipped as degenerate: every score tied (e.g. both class medians "
                  "the zero vector), which carries no information and is never scored 0.5.", ""]
    return lines


def _skip_reasons(leak: pa.Table | None, who: str, layer: str) -> list[str]:
    if leak is None:
        return []
    if "parties" in leak.column_names:
        mine = pc.equal(pc.coalesce(leak["parties"], pc.cast(leak["party_id"], pa.string())), who)
    else:
        mine = pc.equal(pc.cast(leak["party_id"], pa.string()), who)
    skipped = leak.filter(pc.and_(mine, pc.equal(leak["layer"], layer)))
    skipped = skipped.filter(pc.is_valid(skipped["skip_reason"]))
    counts = skipped.group_by("skip_reason").aggregate([("step", "count")]).to_pylist()
    if not counts:
        return []
    return ["Skipped (attack, batch) pairs: "
            + "; ".join(f"{c['skip_reason']}: {c['step_count']}" for c in counts) + ".", ""]


def _epoch_md(summary: dict[str, Any]) -> list[str]:
    per: dict[tuple[str, str], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for e in summary["leak"]:
        if e["scope"] == "epoch":
            per[(_who(e), e["layer"])][e["attack"]][e["epoch"]] = metric_stats(e).get("p95")
    lines = ["## p95 per epoch", "", f"95th percentile over each epoch's batches of the {FLIPPED} "
             f"({OTHER_METRICS}); seed {summary.get('seed')}.", ""]
    for (party, layer), attacks in sorted(per.items(), key=lambda kv: (len(kv[0][0]), kv[0][0],
                                                                       _layer_key(kv[0][1]))):
        epochs = sorted({epoch for values in attacks.values() for epoch in values})
        lines += [f"### Party {party}, {layer} layer", "",
                  *_md_table(["attack", *(f"epoch {ep}" for ep in epochs)],
                             [[a, *(_fmt(v.get(ep)) for ep in epochs)] for a, v in attacks.items()])]
    return lines


def _side_knowledge_md(summary: dict[str, Any]) -> list[str]:
    attacks: dict[str, dict[str, None]] = defaultdict(dict)  # sentence -> its attacks, in order
    for e in _run_entries(summary) + _run_entries(summary, completion=True):
        attacks[e["side_knowledge"]][e["attack"]] = None
    lines = ["## Side knowledge of each attack", "", "As each attack declares it; the tables' short tags "
             "stand for these sentences.", ""]
    lines += [f"- {', '.join(f'`{a}`' for a in names)}: {sentence}" for sentence, names in attacks.items()]
    return [*lines, ""]
