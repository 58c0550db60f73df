"""The leak report in the terminal: compact tables that fit 80 columns, and the warnings."""

from __future__ import annotations

import re
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attacker.analysis.summary import headline, headline_value, metric_stats
from attacker.attacks.exact.report import exact_table
from attacker.attacks.integrity.report import integrity_table
from attacker.attacks.reconstruction.report import reconstruction_table
from attacker.report.cells import (
    FLIPPED,
    OTHER_METRICS,
    parties_label,
    received_tag,
    run_entries,
    side_knowledge_tag,
    spread_cell,
    threat_tag,
)
from splitleak.markdown import fmt as _fmt

# The terminal's side-knowledge tags, short enough for 80 columns; the caption's legend says what
# they mean and report.md has the full sentences.
_COMPACT_TAGS = ((r"^1 clean positive/batch$", "clean pos."), (r"^(\d+) positives?/batch$", r"\1 pos."),
                 (r"^≥(\d+) labels/class/batch$", r"≥\1/class"), (r"^all labels \(oracle\)$", "oracle"),
                 (r"^all other labels \(oracle\)$", "oracle−own"),
                 (r"^positives = minority$", "minority"), (r"^minority / best permutation$", "minority+perm"),
                 (r"^own bottom, (\S+) labelled/class$", r"\1 lab./class"))
TAG_LEGEND = ("side knowledge per batch: k pos. = k known positives; clean pos. = one pre-defense "
              "positive gradient; ≥h/class = labels revealed until h of each class (at most "
              "half the batch); oracle = every label; "
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
    entries = run_entries(summary)
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
        if (parties_label(e), e["layer"]) != previous:
            if previous is not None:
                table.add_section()
            previous = (parties_label(e), e["layer"])
            table.add_row(f"[bold]{e['layer']} layer, party {parties_label(e)} ({escape(threat_tag(e))})[/]")
        stats = metric_stats(e)
        knows = "not applicable (report.md)" if e.get("premise") else \
            received_tag(e, compact_tag(e["attack"], e["side_knowledge"]))
        table.add_row(escape(e["attack"]), _fmt(headline_value(e)),
                      _fmt(stats.get("mean")), spread_cell(e), f"{e['skipped']}/{e['batches']}",
                      escape(knows))
    return table


def completion_table(summary: dict[str, Any]) -> Table | None:
    """Model completion per attacker: top-1 (top-5) on train and test rows, and both baselines."""
    entries = sorted(run_entries(summary, completion=True), key=lambda e: bool(e.get("diagnostic")))
    if not entries:
        return None
    table = Table(title="model completion (label inference accuracy pooled over rows)",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True,
                  caption="train rows exclude the labelled ones; (top-5) beside top-1 for ten or more "
                          "classes; baselines train/test: the "
                          "same head on the labelled rows alone, and MixMatch on a random bottom; "
                          "diag. = a diagnostic (bottom frozen), not the papers' comparable figure")
    for column in ("attacker", "labelled", "train", "test", "labelled\nonly", "random\nbottom"):
        table.add_column(column, justify="left" if column == "attacker" else "right", no_wrap=True)
    for e in entries:
        who = escape(f"{parties_label(e)} {threat_tag(e)}" + (" diag." if e.get("diagnostic") else ""))
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
    if run_entries(summary) or not run_level:
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
