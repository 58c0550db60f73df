"""`splitleak compare SWEEP_DIR | RUN_DIR...`: read the runs, compare, write compare/, print."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from orchestration.compare.read import find_runs
from orchestration.compare.report import UTILITY_LABELS, write_report
from orchestration.compare.table import Comparison, compare
from orchestration.sweep.index import INDEX_FILE, SweepIndexError
from splitleak.cli_common import EXIT_FAILED, BadInput


def compare_and_print(paths: list[Path], out: Path, console: Console, layer: str = "cut",
                      party: int | None = None, leak_stat: str = "flipped_p95",
                      target: float | None = None) -> Comparison | None:
    try:
        runs, warnings = find_runs(paths)
    except (ValueError, SweepIndexError) as err:
        raise BadInput(str(err)) from None
    for warning in warnings:
        console.print(f"[yellow]{escape(warning)}[/]")
    if not runs:
        console.print("[bold red]nothing to compare:[/] no finished, analysed run")
        return None
    seen = len(warnings)
    comparison = compare(runs, layer, party, leak_stat, warnings, target)
    report = write_report(comparison, out, paths)
    if comparison.rows:
        console.print(summary_table(comparison, console.width))
    else:  # nothing at this layer: say why here (otherwise the warnings are in report.md)
        for warning in warnings[seen:]:
            console.print(f"[yellow]{escape(warning)}[/]")
    if comparison.about_speed():  # the settings differ in [network] / [wire]: how fast too
        console.print(speed_table(comparison))
    console.print(f"trade-off report: {report}")
    return comparison


def _fitted(title: str, caption: str, headers: list[str], body: list[list[str]],
            words: tuple[int, ...] = ()) -> Table:
    """Numbers never wrap (each column at least its widest cell); headers and the text
    columns `words` wrap at spaces instead."""
    table = Table(title=title, box=box.SIMPLE_HEAD, caption=caption, show_edge=False,
                  collapse_padding=True)
    for i, header in enumerate(headers):
        widest = 0 if i in words else max((len(row[i]) for row in body), default=0)
        table.add_column(header, justify="left" if i == 0 else "right", min_width=widest)
    for row in body:
        table.add_row(*row)
    return table


def _fits(table: Table, width: int) -> bool:
    console = Console(width=width)
    # Not Measurement.get: it clamps the measurement to the width asked about.
    needed: Measurement = table.__rich_measure__(console, console.options)
    return needed.minimum <= width


def summary_table(comparison: Comparison, width: int = 80) -> Table:
    """Utility and each attack's seed-mean leak per setting; * = on that attack's frontier."""
    rows = comparison.rows
    attacks = comparison.attacks()
    utility = UTILITY_LABELS.get(rows[0]["utility_metric"], "utility") if rows else "utility"
    seeds = {len(s.runs) for s in comparison.settings}
    body = []
    for setting in comparison.settings:
        own = {r["attack"]: r for r in rows if r["setting_key"] == setting.key}
        if not own:
            continue
        value = next(iter(own.values()))["utility_mean"]
        body.append([escape(setting.label), *([str(len(setting.runs))] if len(seeds) > 1 else []),
                     f"{value:.4f}" if value is not None else "-",
                     *(f"{own[a]['leak_mean']:.3f}{'*' if own[a]['pareto'] else ''}"
                       if a in own and own[a]["leak_mean"] is not None else "-" for a in attacks)])
    first = ["setting", *(["seeds"] if len(seeds) > 1 else []), utility]
    each = f"{next(iter(seeds))} seed(s) each; " if len(seeds) == 1 else ""
    caption = (f"{each}leak: {comparison.leak_stat} (accuracy-type attacks: accuracy; "
               "reconstruction: SSIM or R²); * = on "
               "the Pareto frontier. Full report with CIs and DCS: report.md")
    table = _fitted("trade-off (mean over seeds)", caption, [*first, *map(escape, attacks)], body)
    if _fits(table, width):
        return table
    # Too wide with the attacks' names as headers: number them, with a legend.
    legend = "; ".join(f"A{i} = {escape(a)}" for i, a in enumerate(attacks, start=1))
    return _fitted("trade-off (mean over seeds)", f"{legend}. {caption}",
                   [*first, *(f"A{i}" for i in range(1, len(attacks) + 1))], body)


def speed_table(comparison: Comparison) -> Table:
    """Per setting: its network, ms per step, seconds to the target, KiB per step."""
    body = []
    for setting in comparison.settings:
        cfg, pace = setting.first.config, comparison.speed[setting.key]
        kib = pace["kib_per_step"]
        body.append([escape(setting.label), escape(cfg.network.describe(compact=True)),
                     _seconds(pace["ms_per_step_mean"], "{:.1f}"),
                     _seconds(pace["seconds_to_target_mean"], "{:.1f}"),
                     f"{kib:,.0f}" if kib is not None else "-"])
    target = comparison.speed_target
    headers = ["setting", "network", "ms/step",
               f"s to {target:.3f}" if target is not None else "s to target", "KiB"]
    return _fitted("speed (mean over seeds)", "ms/step: median train step; s to: seconds until "
                   "an evaluation reached the utility every run reached; KiB: per train step, protobuf "
                   "bytes both ways at the label party; each setting's wire: report.md",
                   headers, body, words=(1,))


def _seconds(value: float | None, form: str) -> str:
    return form.format(value) if value is not None else "-"


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        raise BadInput(f"no such directory: {', '.join(missing)}")
    single_sweep = len(args.paths) == 1 and (args.paths[0] / INDEX_FILE).exists()
    out = args.output_dir or (args.paths[0] / "compare" if single_sweep else Path("compare"))
    comparison = compare_and_print(args.paths, out, console, args.layer, args.party, args.leak_stat,
                                   args.target_utility)
    return 0 if comparison is not None else EXIT_FAILED
