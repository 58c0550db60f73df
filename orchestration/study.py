"""`splitleak sweep FILE`: the sweep's points run on an engine, then their comparison."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from orchestration.compare.command import compare_and_print
from orchestration.sweep.command import cmd_sweep
from splitleak.artifacts.paths import SweepDir
from splitleak.cli_common import EXIT_INTERRUPTED, BadInput
from splitleak.stopping import EXIT_TERMINATED, Terminated, sigterm_interrupts, stopped_by


def run_study(args: argparse.Namespace, console: Console) -> int:
    """Run the sweep; compare its finished points unless --no-compare. The exit code is the
    sweep's (a failed point: 1; interrupted: 130), or 130 (SIGTERM: 143) for a comparison
    stopped so."""
    sweep = cmd_sweep(args, console)
    if sweep.sweep_dir is not None and sweep.done and not args.no_compare:
        try:
            with sigterm_interrupts():
                compare_and_print([sweep.sweep_dir], SweepDir(sweep.sweep_dir).compare, console,
                                  leak_stat=sweep.leak_stat, layer_asked=False)
        except KeyboardInterrupt as err:  # the report's files are swapped in together: none yet
            console.print(f"[bold red]{stopped_by(err)}[/] while comparing: the sweep's points are "
                          "kept as its index says, its comparison was not written; run the same "
                          "command again, or `splitleak compare "
                          f"{escape(str(sweep.sweep_dir))}`, to write it.")
            return EXIT_TERMINATED if isinstance(err, Terminated) else EXIT_INTERRUPTED
        except BadInput:  # it printed why, e.g. no run's summary has a leak entry; the sweep
            console.print("[yellow]the sweep's comparison was not written (see above); "  # is done
                          f"`splitleak compare {escape(str(sweep.sweep_dir))}` compares it later[/]")
    return sweep.code

