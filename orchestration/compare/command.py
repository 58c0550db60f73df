"""`splitleak compare SWEEP_DIR | RUN_DIR...`: read the runs, compare, write compare/, print."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
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
    comparison = compare(runs, layer, party, leak_stat, warnings, target)
    report = write_report(comparison, out, paths)
    console.print(summary_table(comparison))
    console.print(f"trade-off report: {report}")
    return comparison


def summary_table(comparison: Comparison) -> Table:
    """Utility and each attack's seed-mean leak per setting; * = on that attack's frontier."""
    rows = comparison.rows
    attacks = comparison.attacks()
    utility = UTILITY_LABELS.get(rows[0]["utility_metric"], "utility") if rows else "utility"
    table = Table(title="trade-off (mean over seeds)", box=box.SIMPLE_HEAD,
                  caption=f"leak: {comparison.leak_stat} (accuracy-type attacks: accuracy); "
                          "* = on the Pareto frontier. Full report with CIs and DCS: report.md")
    table.add_column("setting")
    table.add_column("seeds", justify="right")
    table.add_column(utility, justify="right")
    speed = comparison.about_speed()  # the settings differ in [network] / [wire]: how fast too
    if speed:
        table.add_column("ms/step", justify="right")
        table.add_column(f"s to {comparison.speed_target:.3f}" if comparison.speed_target
                         is not None else "s to target", justify="right")
    for attack in attacks:
        table.add_column(escape(attack), justify="right")
    for setting in comparison.settings:
        own = {r["attack"]: r for r in rows if r["setting_key"] == setting.key}
        if not own:
            continue
        first = next(iter(own.values()))
        cells = [f"{own[a]['leak_mean']:.3f}{'*' if own[a]['pareto'] else ''}"
                 if a in own and own[a]["leak_mean"] is not None else "-" for a in attacks]
        value = first["utility_mean"]
        pace = comparison.speed[setting.key]
        timing = [_seconds(pace["ms_per_step_mean"], "{:.1f}"),
                  _seconds(pace["seconds_to_target_mean"], "{:.1f}")] if speed else []
        table.add_row(escape(setting.label), str(len(setting.runs)),
                      f"{value:.4f}" if value is not None else "-", *timing, *cells)
    return table


def _seconds(value: float | None, form: str) -> str:
    return form.format(value) if value is not None else "-"


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        raise BadInput(f"no such directory: {', '.join(missing)}")
    if args.layer not in ("cut", "first"):
        raise BadInput(f"--layer must be cut or first, got {args.layer!r}")
    single_sweep = len(args.paths) == 1 and (args.paths[0] / INDEX_FILE).exists()
    out = args.output_dir or (args.paths[0] / "compare" if single_sweep else Path("compare"))
    comparison = compare_and_print(args.paths, out, console, args.layer, args.party, args.leak_stat,
                                   args.target_utility)
    return 0 if comparison is not None else EXIT_FAILED
