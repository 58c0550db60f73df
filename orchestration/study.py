"""`splitleak sweep FILE`: the sweep's points run on an engine, then their comparison."""

from __future__ import annotations

import argparse

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestration.compare.command import compare_and_print
from orchestration.compare.table import Comparison
from orchestration.sweep.command import cmd_sweep
from splitleak.artifacts.paths import SweepDir


def run_study(args: argparse.Namespace, console: Console) -> int:
    """Run the sweep; compare its finished points unless --no-compare. The exit code is the
    sweep's (a failed point: 1; interrupted: 130)."""
    sweep = cmd_sweep(args, console)
    if sweep.sweep_dir is not None and sweep.done and not args.no_compare:
        comparison = compare_and_print([sweep.sweep_dir], SweepDir(sweep.sweep_dir).compare,
                                       console, leak_stat=sweep.leak_stat, layer_asked=False)
        if comparison is not None and (others := measured_elsewhere(comparison)) is not None:
            console.print(others)
    return sweep.code


def measured_elsewhere(comparison: Comparison) -> Table | None:
    """The settings the trade-off table leaves out because none of their attacks is measured
    at its layer (e.g. a scenario of integrity attacks only, scored at the output), with their
    utility, C-DCS and attacks from the capability rows; None when every setting is in it."""
    compared = {r["setting_key"] for r in comparison.rows}
    table = Table(title=f"settings with no leak at the {comparison.layer} layer (mean over seeds)",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True,
                  caption="their attacks are measured at another layer; each attack's DCS and "
                          "T-DCS: report.md, Defense capability")
    for header in ("setting", "utility", "C-DCS", "attacks (layer)"):
        table.add_column(header, justify="right" if header in ("utility", "C-DCS") else "left")
    for setting in comparison.settings:
        own = [r for r in comparison.capability
               if r["setting_key"] == setting.key and not r["diagnostic"]]
        if setting.key in compared or not own:
            continue
        utility, c_dcs = own[0]["utility_mean"], own[0]["c_dcs_mean"]
        table.add_row(escape(setting.label), "-" if utility is None else f"{utility:.4f}",
                      "-" if c_dcs is None else f"{c_dcs:.3f}",
                      escape(", ".join(f"{r['attack']} ({r['layer']})" for r in own)))
    return table if table.row_count else None
