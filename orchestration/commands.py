"""What `splitleak run` and `splitleak validate` do (imported only when those commands run)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich import box
from rich.console import Console
from rich.table import Table

from orchestration.progress import RunProgress, format_eval
from orchestration.run import RunFailed, RunOutcome, run_distributed
from splitleak.arguments import output_dir_problem
from splitleak.artifacts.outcome import read_outcome
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.checkpoint import CheckpointError, Manifest, latest, missing_log, resume_point
from splitleak.cli_common import EXIT_BAD_INPUT, EXIT_FAILED, BadInput, checked_config_or_exit
from splitleak.config import ExperimentConfig, PluginSpec
from splitleak.datasets import DatasetError
from splitleak.fileio import describe_os_error
from splitleak.filekind import not_a_file
from splitleak.placement import cores
from splitleak.provenance import PluginError
from splitleak.transport import why_not_listening


def default_variants(cfg: ExperimentConfig) -> list[tuple[str, ExperimentConfig]]:
    """The built-in default shows the point of the tool: the same run without a defense and
    with Marvell (s = 4), side by side."""
    marvell = cfg.model_copy(update={
        "run": cfg.run.model_copy(update={"name": f"{cfg.run.name}-marvell"}),
        "defense": [PluginSpec(name="marvell", s=4.0)]})
    return [("no defense", cfg), ("marvell s=4", marvell)]


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    if args.single and (args.config is not None or args.resume is not None):
        given = f"the config {args.config}" if args.config is not None else "--resume"
        raise BadInput(f"--single picks the run without a defense out of the built-in default's "
                       f"two; {given} runs exactly one experiment already: drop --single")
    if args.resume is not None and args.output_dir is not None:
        raise BadInput(f"--output-dir: a resumed run continues in its own directory "
                       f"({args.resume}); drop --output-dir")
    if args.resume is not None:
        return resume_run(args, console)
    cfg = checked_config_or_exit(args.config)
    if args.in_process and cfg.network.shaped:  # as the in-process sweep engine refuses it
        raise BadInput("[network] sets an emulated wide-area link, which an --in-process run has "
                       "no network to shape (its parties call each other in one process): drop "
                       "--in-process to measure it, or drop the [network] table")
    if not args.in_process:
        check_label_party_address(cfg)
    if args.output_dir is not None:
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"output_dir": args.output_dir})})
    variants = default_variants(cfg) if args.config is None and not args.single else [
        (cfg.run.name, cfg)]
    compared = []
    side_by_side = len(variants) > 1  # the runs' own leak tables give way to one comparison
    for label, variant in variants:
        outcome = train_one(variant, args, console, label)
        print_summary(console, outcome)
        summary = None
        if analysable(variant):
            summary = _analyse_trained(outcome, console, leak_table=not side_by_side)
        else:
            console.print(NOTHING_TO_ANALYSE, markup=False)
        compared.append((label, summary, outcome))
    if side_by_side and all(summary for _, summary, _ in compared):
        from attacker.report.report import utility
        from attacker.report.terminal import comparison_table

        console.print(comparison_table([(label, summary, utility(outcome.run))
                                        for label, summary, outcome in compared if summary]))
        console.print("each run's full leak table, threat model and plots: its report/report.md")
    return 0


def check_label_party_address(cfg: ExperimentConfig) -> None:
    """A fixed topology.label_party_address this host cannot listen on is refused before any
    role starts (the label party would say so only after its imports and its data)."""
    address = cfg.topology.label_party_address
    if not address.endswith(":0") and (why := why_not_listening(address)) is not None:
        raise BadInput(f"topology.label_party_address = {address!r}: the label party cannot "
                       f"listen there ({why}); free that port, or use port 0 (any free port)")


def resume_run(args: argparse.Namespace, console: Console) -> int:
    """`splitleak run [CONFIG] --resume RUN_DIR`: finish an interrupted run."""
    run = RunDir(args.resume)
    if args.in_process:
        raise BadInput("--resume continues a distributed run; --in-process cannot resume")
    if not run.root.is_dir():
        raise BadInput(f"--resume: {run.root} {not_a_file(run.root)}; give the run directory to "
                       "resume")
    if not run.config.is_file():
        raise BadInput(f"--resume: {run.root} is not a run directory (it has no config.toml)")
    cfg = checked_config_or_exit(args.config or run.config)
    try:
        # all in this run directory; why newer checkpoints are passed over is said under the
        # run's lock, with the step it resumes at (a resume refused as in use says neither)
        manifest = resume_point(run.root, cfg, every_party=True, warn=False)
    except CheckpointError as err:
        unanalysed = (read_outcome(run).get("status") == "ok" and analysable(cfg)
                      and not run.leak_summary.exists())  # stopped between training and analysis
        raise BadInput(f"--resume: {err}" + (
            f"; its analysis is missing: `attacker analyze {run.root}` writes it"
            if unanalysed else "")) from None
    problem = missing_log(run.root, manifest)  # this command's sidecar logs into the run
    if problem is not None:
        raise BadInput(f"--resume: {problem}")

    def resuming(manifest: Manifest | None) -> None:
        check_label_party_address(cfg)  # under the run's lock: its own live run is named so
        at = (f"step {manifest.step} ({manifest.reason} checkpoint)" if manifest
              else "step 0 (no checkpoint)")
        console.print(f"[bold]{cfg.run.name}[/]: resuming {run.root} at {at}")

    outcome = _distributed(cfg, run, args, console, resume=True, resuming=resuming)
    print_summary(console, outcome)
    if analysable(cfg):
        _analyse_trained(outcome, console)
    else:
        console.print(NOTHING_TO_ANALYSE, markup=False)
    return 0


def train_one(cfg: ExperimentConfig, args: argparse.Namespace, console: Console,
              label: str) -> RunOutcome:
    """One run, distributed (default) or in-process; SystemExit (after saying why) if it failed."""
    try:
        run = create_run_dir(cfg)
    except OSError as err:
        problem = output_dir_problem(cfg.run.output_dir)  # e.g. a file where a directory is
        raise BadInput(f"cannot create the run directory: {problem or describe_os_error(err)}") \
            from None
    console.print(f"[bold]{label}[/]: run directory {run.root}")
    if args.in_process:
        from label_party.trainer import NonFiniteStep
        from orchestration.reference import train_in_process
        from passive_party.protections.base import ProtectionFailed

        try:
            return train_in_process(cfg, run, watch=True)
        except (NonFiniteStep, ProtectionFailed) as err:  # the run (or a party's protection)
            console.print(f"[bold red]run failed:[/] {err}")  # diverged: said in one sentence
            raise SystemExit(EXIT_FAILED) from None
        except PluginError as err:  # an objective or defense that broke: as a distributed run
            console.print(f"[bold red]run failed:[/] {err}")
            raise SystemExit(EXIT_BAD_INPUT) from None
        except DatasetError as err:  # a bad value in a data file: bad input, in one sentence
            raise BadInput(f"{label}: DatasetError: {err}") from None
        except OSError as err:  # e.g. a full disk at the final save
            raise BadInput(f"{label}: {describe_os_error(err)}") from None
    return _distributed(cfg, run, args, console)


def _distributed(cfg: ExperimentConfig, run: RunDir, args: argparse.Namespace, console: Console,
                 resume: bool = False,
                 resuming: Callable[[Manifest | None], None] | None = None) -> RunOutcome:
    try:
        with RunProgress(f"{cfg.run.name}", console, enabled=not args.no_progress) as progress:
            return run_distributed(cfg, run, progress, resume=resume, resuming=resuming)
    except RunFailed as err:
        console.print(f"[bold red]run failed:[/] {err}")
        console.print(f"logs: {run.logs}")
        _resume_hint(console, run, refused=err.exit_code == EXIT_BAD_INPUT)
        raise SystemExit(err.exit_code) from None
    except OSError as err:  # e.g. a read-only run directory: its lock cannot be taken
        raise BadInput(f"run {run.root}: {describe_os_error(err)}") from None
    except KeyboardInterrupt:
        _resume_hint(console, run)
        raise


def _resume_hint(console: Console, run: RunDir, refused: bool = False) -> None:
    """How to go on; `refused`: a role refused its input (e.g. a resume's metrics), which a
    resume as such will refuse again until what it named is fixed."""
    if read_outcome(run).get("status") == "ok":  # stopped after training, before its analysis
        console.print(f"training finished; analyse it with [bold]attacker analyze {run.root}[/]")
        return
    newest = latest(run.root)
    if newest is not None:
        fixed = "once what is named above is fixed, " if refused else ""
        console.print(f"checkpoint at step {newest.step}: {fixed}finish the run with "
                      f"[bold]splitleak run --resume {run.root}[/]")


NOTHING_TO_ANALYSE = ("no analysis, no report: the threat model has no curious, malicious or "
                      "receiving party (attacker.enabled, [threat.parties.K], [threat.receiver]), "
                      "so nothing was recorded to attack; the utility is above")


def analysable(cfg: ExperimentConfig) -> bool:
    """A run has something to analyse: a tapped party, or a run-level attack of the threat model."""
    return cfg.attacker.enabled and bool(cfg.tapped_parties or cfg.received_parties or any(
        p.labelled_per_class or p.integrity for p in cfg.threat.parties.values()))


def _analyse_trained(outcome: RunOutcome, console: Console, leak_table: bool = True) -> dict:
    """analyse_run for `splitleak run`: its training is done whatever stops the analysis (a
    full or read-only disk: exit 2; Ctrl-C), so say so, and how to write the analysis."""
    later = f"[bold]attacker analyze {outcome.run.root}[/]"
    try:
        return analyse_run(outcome, console, leak_table=leak_table)
    except OSError as err:
        raise BadInput(f"training finished, but its analysis could not be written: "
                       f"{describe_os_error(err)}; once that is fixed, `attacker analyze "
                       f"{outcome.run.root}` writes it (the training need not run again)") from None
    except KeyboardInterrupt:
        console.print(f"training finished; its analysis was stopped: {later} writes it")
        raise
    except PluginError as err:  # an attack of one's own that broke: bad input, one sentence
        raise BadInput(f"training finished, but its analysis stopped: {err}; once that is fixed, "
                       f"`attacker analyze {outcome.run.root}` writes it (the training need not "
                       "run again)") from None


def analyse_run(outcome: RunOutcome, console: Console,
                leak_table: bool = True, jobs: int | None = None) -> dict:
    """The attacker's offline analysis of a finished run, and its report (and, unless told
    otherwise, its leak table in the terminal); `jobs` processes run its batch attacks (None:
    auto, the cores this run may use, its share of them in a sweep)."""
    from attacker.report.pipeline import analyse_and_report
    from attacker.report.terminal import print_leak_table, print_warnings

    # the attacks its config lists, else the defaults
    summary = analyse_and_report(outcome.run.root, jobs=jobs or cores())
    if leak_table:
        print_leak_table(console, summary)
    print_warnings(console, summary)
    console.print(f"report: {outcome.run.report_md}")
    return summary


def print_summary(console: Console, outcome: RunOutcome) -> None:
    table = Table(title=f"run {outcome.run.root.name} ({outcome.mode})", box=box.SIMPLE_HEAD,
                  caption="wall s includes start-up; steps/s is over training only")
    table.add_column("train steps", justify="right")
    table.add_column("steps/s", justify="right")
    table.add_column("wall s", justify="right")
    table.add_column("test metric", no_wrap=True)
    table.add_column("test loss", justify="right")
    final = outcome.final_eval or {}
    table.add_row(str(outcome.train_steps), f"{outcome.steps_per_second:.1f}",
                  f"{outcome.seconds:.1f}",
                  format_eval(final) if final else "-",
                  f"{final['test_loss']:.4f}" if final else "-")
    console.print(table)
