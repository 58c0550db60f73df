"""`splitleak sweep FILE`: resolve the points and run the unfinished ones on an engine (the
comparison that follows is orchestration/study.py's)."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from orchestration.commands import check_label_party_address
from orchestration.sweep.arguments import MAX_CPUS_PER_ROLE
from orchestration.sweep.engine import Engine, EngineError
from orchestration.sweep.index import SweepIndex
from orchestration.sweep.points import Point, resolve
from orchestration.sweep.ray_failures import bound_connect
from orchestration.sweep.runner import SweepOutcome, run_points
from orchestration.sweep.spec import SweepError, SweepFile, base_path, load_sweep
from orchestration.sweep.workdir import check_working_directory
from splitleak.arguments import output_dir_problem
from splitleak.artifacts.paths import SweepDir
from splitleak.artifacts.rundir import RunInUse, holding
from splitleak.artifacts.sweep import SweepIndexError
from splitleak.cli_common import EXIT_FAILED, EXIT_INTERRUPTED, BadInput
from splitleak.config import ConfigError, ExperimentConfig, load_config
from splitleak.stopping import EXIT_TERMINATED, Terminated, sigterm_interrupts, stopped_by
from splitleak.validation import validated


def build_engine(args: argparse.Namespace) -> Engine:
    """The engine the arguments ask for; BadInput (exit 2) for an impossible combination."""
    if args.jobs is not None and args.jobs < 1:
        raise BadInput(f"--jobs must be at least 1, got {args.jobs}")
    if args.engine != "ray":
        ray_only = [o for o, given in (("--address", args.address), ("--spread", args.spread),
                                       ("--shared-dir", args.shared_dir),
                                       ("--cpus-per-role", args.cpus_per_role is not None)) if given]
        if ray_only:
            verb = "applies" if len(ray_only) == 1 else "apply"
            raise BadInput(f"{', '.join(ray_only)} {verb} only to --engine ray")
    if args.engine == "local":
        from orchestration.sweep.local import LocalEngine

        return LocalEngine(args.jobs)
    if args.engine == "inprocess":
        from orchestration.sweep.inprocess import InProcessEngine

        return InProcessEngine(args.jobs)
    cpus = 1.0 if args.cpus_per_role is None else args.cpus_per_role
    if not 0 < cpus <= MAX_CPUS_PER_ROLE:  # also refuses nan
        raise BadInput(f"--cpus-per-role must be more than 0 and at most {MAX_CPUS_PER_ROLE}, "
                       f"got {args.cpus_per_role:g}")
    bound_connect()  # before Ray is imported
    try:
        from orchestration.sweep.ray_engine import RayEngine
    except ImportError as err:
        raise BadInput(f"--engine ray needs Ray ({err}); install the extra: "
                       "pip install 'splitleak[ray]'") from None
    return RayEngine(args.address, spread=args.spread, shared_dir=args.shared_dir, jobs=args.jobs,
                     cpus_per_role=cpus)


def check_ports(points: Sequence[Point], engine: Engine) -> None:
    """Concurrent points on one machine each need their own ports: only port 0 (any free port)."""
    fixed = sorted({p.config.topology.label_party_address for p in points
                    if not p.config.topology.label_party_address.endswith(":0")})
    if fixed and engine.name == "local" and engine.jobs > 1:
        raise BadInput(f"topology.label_party_address = {fixed[0]!r} is a fixed port, but --jobs "
                       f"{engine.jobs} runs points at the same time: use port 0 (any free port) or "
                       "--jobs 1")
    if engine.name == "local":  # each fixed address, once; port 0 is any free port
        for address in fixed:
            check_label_party_address(next(p.config for p in points
                                           if p.config.topology.label_party_address == address))


def check_network(points: Sequence[Point], engine: Engine) -> None:
    """[network] is emulated by relays that the local engine's `splitleak run` starts."""
    shaped = [p.setting for p in points if p.config.network.shaped]
    if shaped:
        check_engine_emulates(f"point {shaped[0]!r}", engine)


def check_engine_emulates(which: str, engine: Engine) -> None:
    """BadInput unless `engine` emulates the [network] that `which` (a point, a config) sets."""
    if engine.name != "local":
        instead = ("has no network to shape (its parties call each other in one process)"
                   if engine.name == "inprocess" else "would measure the cluster's own network instead")
        raise BadInput(f"{which} sets [network] (an emulated wide-area link), which only "
                       f"--engine local emulates (its relays run beside `splitleak run`); "
                       f"--engine {engine.name} {instead}")


def sweep_points(sweep: SweepFile, source: Path | None, sweep_dir: Path,
                 base: ExperimentConfig | None = None) -> list[Point]:
    """Every point, validated like `splitleak validate`; BadInput names the field."""
    try:
        base = base or load_config(base_path(sweep, source))
        return resolve(sweep, base, sweep_dir, check=validated)
    except ConfigError as err:
        raise BadInput(f"sweep.base: {err}") from None
    except SweepError as err:
        raise BadInput(str(err)) from None


@dataclass(frozen=True)
class SweepRun:
    """What a sweep command ended with: its exit code, and where a comparison would look."""

    code: int
    sweep_dir: Path | None = None
    leak_stat: str = "flipped_p95"
    done: int = 0  # points finished, this time or before


def cmd_sweep(args: argparse.Namespace, console: Console) -> SweepRun:
    try:
        sweep = load_sweep(args.file)
    except SweepError as err:
        raise BadInput(str(err)) from None
    engine = build_engine(args)
    if args.shared_dir is not None and args.output_dir is not None:  # one would be ignored
        raise BadInput(f"--output-dir {args.output_dir} and --shared-dir {args.shared_dir} both "
                       "say where the sweep goes (with --shared-dir: SHARED_DIR/<sweep.name>, "
                       "which every node mounts): drop one")
    output_dir = args.shared_dir or args.output_dir or sweep.sweep.output_dir
    sweep_dir = Path(output_dir).resolve() / sweep.sweep.name if args.shared_dir else (
        Path(output_dir) / sweep.sweep.name)
    if (problem := output_dir_problem(sweep_dir)) is not None:
        raise BadInput(f"cannot write the sweep directory {sweep_dir}: {problem}")
    points = sweep_points(sweep, args.file, sweep_dir)
    check_network(points, engine)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as held:
        try:  # one sweep at a time in a directory: a second would re-create the first's runs
            held.enter_context(holding(SweepDir(sweep_dir).lock, sweep_dir, "sweeping it again"))
        except RunInUse as err:
            raise BadInput(str(err)) from None
        check_ports(points, engine)  # held: a port in use by this sweep's own run is named so
        return _sweep(args, console, sweep, engine, sweep_dir, points)


def _sweep(args: argparse.Namespace, console: Console, sweep: SweepFile, engine: Engine,
           sweep_dir: Path, points: list[Point]) -> SweepRun:
    try:
        index = SweepIndex(sweep_dir, points, engine.name)
    except SweepIndexError as err:
        raise BadInput(str(err)) from None
    if engine.name != "ray":  # on Ray the label party checks the data on its own node
        check_working_directory(sweep_dir, points)
    shutil.copyfile(args.file, SweepDir(sweep_dir).sweep_file)
    console.print(f"sweep [bold]{sweep.sweep.name}[/]: {_points(len(points))} in {sweep_dir} "
                  f"({engine.name} engine, {engine.at_a_time()})")
    if index.left_out:
        console.print(_left_out(index.left_out))
    try:  # the points run in this process too, with --engine inprocess --jobs 1
        with sigterm_interrupts():
            outcome = run_points(points, index, engine, retry_failed=args.retry_failed,
                                 console=console, show_progress=not args.no_progress)
    except EngineError as err:
        raise BadInput(f"--engine {engine.name}: {err}") from None
    except KeyboardInterrupt as err:
        counts = index.counts()
        console.print(f"[bold red]{stopped_by(err)}[/]: every running point was stopped; index "
                      f"{index.path}: {_counts(counts)}. Run the same command again to resume.")
        return SweepRun(EXIT_TERMINATED if isinstance(err, Terminated) else EXIT_INTERRUPTED)
    _print_outcome(console, outcome, index)
    return SweepRun(EXIT_FAILED if outcome.counts.get("failed") else 0, sweep_dir,
                    sweep.sweep.leak_stat, outcome.counts.get("done", 0))


def _left_out(rows: list[dict]) -> str:
    """The points an edited sweep file no longer has, by label and status."""
    shown = ", ".join(f"{row['label']} ({row['status']})" for row in rows[:5])
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    return (f"the sweep file no longer has {_points(len(rows))} of its earlier run ({shown}{more}): "
            "they leave the index and its comparison; their run directories are kept, and a "
            "point the file names again is taken up from there")


def _points(count: int) -> str:
    return f"{count} point" + ("" if count == 1 else "s")


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def _print_outcome(console: Console, outcome: SweepOutcome, index: SweepIndex) -> None:
    ran = len(outcome.results)
    console.print(f"{_points(outcome.points)}: {ran} run now, {outcome.skipped} skipped "
                  f"(finished earlier, or failed earlier without --retry-failed); index: "
                  f"{_counts(outcome.counts)}")
    failed = [row for row in index.rows.values() if row["status"] == "failed"]
    for row in failed:
        console.print(f"[red]failed[/] {row['label']} ({row['run_dir']}): {row['message']}")
    if failed:
        console.print("rerun with --retry-failed to try the failed points again")
