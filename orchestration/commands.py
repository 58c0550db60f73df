"""What `splitleak run` and `splitleak validate` do (imported only when those commands run)."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from label_party.validate import check_chain
from orchestration.progress import RunProgress, format_eval
from orchestration.run import RunFailed, RunOutcome, collect_outcome, run_distributed
from splitleak.cli_common import (
    EXIT_FAILED,
    BadInput,
    config_or_exit,
)
from splitleak.config import ConfigError, ExperimentConfig, PluginSpec
from splitleak.rundir import create_run_dir
from splitleak.validation import check_core


def validate(cfg: ExperimentConfig) -> None:
    """Everything that can be checked before a process starts; ConfigError names the field."""
    check_core(cfg)
    check_chain(cfg)


def load_checked(path: str | None) -> ExperimentConfig:
    cfg = config_or_exit(path)
    try:
        validate(cfg)
    except ConfigError as err:
        raise BadInput(f"invalid config {path or '(built-in default)'}: {err}") from None
    return cfg


def default_variants(cfg: ExperimentConfig) -> list[tuple[str, ExperimentConfig]]:
    """The built-in default shows the point of the tool: the same run without a defense and
    with Marvell (s = 4), side by side."""
    marvell = cfg.model_copy(update={
        "run": cfg.run.model_copy(update={"name": f"{cfg.run.name}-marvell"}),
        "defense": [PluginSpec(name="marvell", s=4.0)]})
    return [("no defense", cfg), ("marvell s=4", marvell)]


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    cfg = load_checked(args.config)
    if args.output_dir is not None:
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"output_dir": args.output_dir})})
    variants = default_variants(cfg) if args.config is None and not args.single else [
        (cfg.run.name, cfg)]
    compared = []
    for label, variant in variants:
        outcome = train_one(variant, args, console, label)
        if outcome is None:
            return EXIT_FAILED
        print_summary(console, outcome)
        summary = None
        if variant.attacker.enabled and (variant.tapped_parties or any(
                p.labelled_per_class for p in variant.threat.parties.values())):
            summary = analyse_run(variant, outcome, console)
        compared.append((label, summary, outcome))
    if len(compared) > 1 and all(summary for _, summary, _ in compared):
        from attacker.report import comparison_table, utility

        console.print(comparison_table([(label, summary, utility(outcome.run))
                                        for label, summary, outcome in compared]))
    return 0


def train_one(cfg: ExperimentConfig, args: argparse.Namespace, console: Console,
              label: str) -> RunOutcome | None:
    """One run, distributed (default) or in-process; None (after saying why) if it failed."""
    run = create_run_dir(cfg)
    console.print(f"[bold]{label}[/]: run directory {run.root}")
    try:
        if args.in_process:
            from orchestration.reference import run_reference

            started = time.monotonic()
            run_reference(cfg, run)
            return collect_outcome(run, "in-process", time.monotonic() - started)
        with RunProgress(f"{cfg.run.name}", console, enabled=not args.no_progress) as progress:
            return run_distributed(cfg, run, progress)
    except RunFailed as err:
        console.print(f"[bold red]run failed:[/] {err}")
        console.print(f"logs: {run.logs}")
        return None


def analyse_run(cfg: ExperimentConfig, outcome: RunOutcome, console: Console) -> dict:
    """The attacker's offline analysis of a finished run, and its report."""
    from attacker.analysis import analyze
    from attacker.report import print_leak_table, write_report
    from attacker.summary import write_summary

    specs = [(a.name, a.params) for a in cfg.attacker.attacks] or None
    summary = analyze(outcome.run.root, specs)
    write_report(outcome.run, summary)
    write_summary(outcome.run, summary)
    print_leak_table(console, summary)
    console.print(f"report: {outcome.run.report / 'report.md'}")
    return summary


def print_summary(console: Console, outcome: RunOutcome) -> None:
    table = Table(title=f"run {outcome.run.root.name} ({outcome.mode})")
    table.add_column("train steps", justify="right")
    table.add_column("steps/s (training)", justify="right")
    table.add_column("wall s (with start-up)", justify="right")
    table.add_column("test metric")
    table.add_column("test loss", justify="right")
    final = outcome.final_eval or {}
    table.add_row(str(outcome.train_steps), f"{outcome.steps_per_second:.1f}",
                  f"{outcome.seconds:.1f}",
                  format_eval(final) if final else "-",
                  f"{final['test_loss']:.4f}" if final else "-")
    console.print(table)
