"""`splitleak`: run an experiment (distributed or in-process), validate a config, benchmark."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from splitleak.arguments import (
    MAX_PARTIES,
    device,
    float_in,
    host_port,
    int_in,
    seed,
    writable_dir,
    writable_file,
)
from splitleak.cli_common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    command_console,
    end_process,
    setup_logging,
)

MAX_CERT_DAYS = 36_500  # a certificate's validity: 100 years ends well inside X.509's dates
# The soak's long run splits breast_cancer's 30 columns among its parties (orchestration/soak.py):
# at most one party per column.
SOAK_MAX_PARTIES = 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="splitleak", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train one experiment (default: the built-in default)")
    r.add_argument("config", nargs="?", help="experiment TOML (omit for the built-in default)")
    r.add_argument("--in-process", action="store_true",
                   help="run the in-process reference (no network) instead of separate processes")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--single", action="store_true",
                   help="with the built-in default (no config): only the run without a defense")
    r.add_argument("--output-dir", type=writable_dir, help="override run.output_dir")
    r.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="finish an interrupted run from its newest complete checkpoint")
    v = sub.add_parser("validate", help="check an experiment file and exit (2 if invalid)")
    v.add_argument("config", nargs="?")
    b = sub.add_parser("bench", help="distributed vs in-process throughput, wire overhead")
    b.add_argument("--steps", type=int_in(10, 1_000_000), default=60,
                   help="train steps per measured run, at least 10; default 60")
    b.add_argument("--rounds", type=int_in(1, 1_000_000),
                   help="interleaved rounds (every variant once per round); default 5")
    b.add_argument("--quick", action="store_true",
                   help="one round: a smoke run, no spread (not with --rounds)")
    b.add_argument("--parties", type=int_in(1, MAX_PARTIES), nargs="+", metavar="N",
                   help="also measure distributed vs in-process with N passive parties "
                        "(e.g. 2 4 8), each keeping the cut width 128")
    b.add_argument("--threads", type=int_in(1, 1024), metavar="T",
                   help="the in-process baselines' threads besides 1, --parties groups' too "
                        "(default: as many as the distributed run's processes have in all; 1: "
                        "only the 1-thread baseline)")
    b.add_argument("--device", type=device, default="cpu", metavar="DEVICE",
                   help="where every role computes: cpu (default), cuda, cuda:K, auto")
    b.add_argument("--setup", default="ctr", choices=("ctr", "cifar-resnet18"),
                   help="ctr (default): the default set-up (synthetic CTR, batch 1024); cifar-resnet18: "
                        "Fu et al.'s CIFAR-10 split with ResNet-18 bottoms, batch 32 (a GPU's)")
    b.add_argument("--plaintext", action="store_true",
                   help="also measure the distributed run without TLS: what mutual TLS costs a "
                        "step")
    b.add_argument("--cuda-graphs", action="store_true",
                   help="also measure in-process and distributed with every party's train step "
                        "replayed as CUDA graphs (run.cuda_graphs; a GPU's)")
    b.add_argument("--busy-load", type=float_in(0.0), metavar="LOAD",
                   help="also flag rounds whose 1-minute load average is above LOAD as busy "
                        "(default: only where other processes' CPU cannot be measured, at half "
                        "the cores)")
    b.add_argument("--json", type=writable_file, metavar="FILE",
                   help="write every round and the summary here (default: print it)")
    k = sub.add_parser("soak", help="hostile messages against every RPC of live services, then a "
                       "long many-party run: crashes, hangs, status codes, RSS growth")
    k.add_argument("--messages", type=int_in(1, 10_000_000), default=10_000,
                   help="hostile cases per RPC (default 10,000)")
    k.add_argument("--parties", type=int_in(1, SOAK_MAX_PARTIES), default=8,
                   help=f"passive parties of the long run, 1..{SOAK_MAX_PARTIES} (it splits "
                   f"breast_cancer's {SOAK_MAX_PARTIES} columns among them; default 8)")
    k.add_argument("--steps", type=int_in(1, 10_000_000), default=10_000,
                   help="train steps of the long run (default 10,000)")
    k.add_argument("--seed", type=seed, default=0,
                   help="seed of the hostile messages (default 0)")
    k.add_argument("--skip-fuzz", action="store_true", help="no hostile messages")
    k.add_argument("--skip-run", action="store_true", help="no long run")
    y = sub.add_parser("relay", help="a shaping TCP relay: emulated latency, jitter and "
                       "bandwidth in front of a label party (what [network] starts per party)")
    y.add_argument("--to", type=host_port(at_file=True), required=True, metavar="HOST:PORT",
                   help="the label party (or @FILE: the address its process writes)")
    y.add_argument("--listen", type=host_port(0), default="127.0.0.1:0",
                   help="HOST:PORT (port 0: any free; default 127.0.0.1:0)")
    y.add_argument("--latency-ms", type=float, help="one-way latency (default 0)")
    y.add_argument("--jitter-ms", type=float, help="std of the one-way latency (default 0)")
    y.add_argument("--bandwidth-mbit", type=float, help="per direction (default: unlimited)")
    y.add_argument("--seed", type=int, help="seed of the jitter (default 0)")
    y.add_argument("--config", type=Path, help="instead of the four options above: the link of "
                   "this experiment's [network] (and its seed), as `splitleak run` starts it; "
                   "needs --party-id")
    y.add_argument("--party-id", type=int, help="with --config: the passive party behind this relay")
    y.add_argument("--port-file", type=Path, help="write the bound HOST:PORT here")
    h = sub.add_parser("health", help="probe a party's gRPC health service (exit 0 if SERVING)")
    h.add_argument("address", type=host_port(), help="HOST:PORT")
    h.add_argument("--service", default="", help="service name (default: the whole server)")
    h.add_argument("--timeout", type=float_in(0.0, 3600.0, low_open=True), default=5.0,
                   help="seconds (default 5)")
    h.add_argument("--tls-dir", type=Path, help="probe over mutual TLS with these identities")
    h.add_argument("--identity", default="attacker",
                   help="client identity for --tls-dir (default attacker; on one party per host, "
                        "the identity that host holds, e.g. label-party)")
    from orchestration.sweep.arguments import add_arguments as sweep_arguments

    sweep_arguments(sub.add_parser(
        "sweep", help="run every point of a sweep file (resumable), then compare them",
        description="Run every point of a sweep file (variants x axes x seeds, each an ordinary "
                    "multi-process run) on the local or a Ray engine; points already done are "
                    "skipped, Ctrl-C stops them all; then write the trade-off report (compare/)."))
    from orchestration.compare.arguments import add_arguments as compare_arguments

    compare_arguments(sub.add_parser(
        "compare", help="the trade-off report of a sweep directory or of run directories",
        description="Per defense setting and attack: utility and leak over seeds (mean, 95 % t "
                    "interval, worst / best), VFLAIR's DCS / T-DCS / C-DCS and ours, the Pareto "
                    "frontier; writes report.md, table.parquet/.csv and PNGs."))
    sub.add_parser("gafm-select", add_help=False,
                   help="choose GAFM's Δ on random 10 %% subsets (GAFM App. D.3); --help for more")
    c = sub.add_parser("certs", help="make a CA and one TLS identity per party (mutual TLS)")
    c.add_argument("directory", type=writable_dir)
    c.add_argument("--parties", type=int, required=True,
                   help=f"number of passive parties, 1..{MAX_PARTIES}")
    c.add_argument("--days", type=int, default=30,
                   help=f"validity in days, 1..{MAX_CERT_DAYS} (default 30)")
    c.add_argument("--force", action="store_true",
                   help="replace the CA and identities already in DIRECTORY")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gafm-select"]:  # its own parser, options and all
        from orchestration.gafm_select import main as gafm_select

        return gafm_select(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "relay":
        from orchestration.relay import cmd_relay

        return cmd_relay(args)
    setup_logging("splitleak")
    console = command_console()
    if args.command == "run":
        return _run(args, console)
    _warm_up(args)
    if args.command in ("sweep", "compare"):
        return _sweep_or_compare(args, console)
    if args.command == "health":
        from splitleak.cli_common import tls_dir_or_exit
        from splitleak.health import probe

        tls_dir_or_exit(None, args.tls_dir, args.identity)  # an incomplete identity: exit 2
        ok, message = probe(args.address, args.service, args.timeout, args.tls_dir, args.identity)
        print(message)
        return 0 if ok else EXIT_FAILED
    if args.command == "certs":
        return _certs(args, console)
    if args.command == "validate":
        from splitleak.cli_common import checked_config_or_exit

        # every value of the data files read too; warnings (allowed, but probably a mistake)
        # are logged
        checked_config_or_exit(args.config, read_values=True)
        console.print("config is valid")
        return 0
    if args.command == "soak":
        from orchestration.soak import run_soak

        if args.skip_fuzz and args.skip_run:
            k.error("--skip-fuzz and --skip-run together leave nothing to soak; give at most one")

        return run_soak(args, console)
    from orchestration.bench import run_bench

    return run_bench(args, console)


def _run(args: argparse.Namespace, console: Console) -> int:
    """`splitleak run`; a Ctrl-C or SIGTERM at any point of it, start-up included, is said."""
    from splitleak.artifacts.rundir import RunInUse
    from splitleak.cli_common import BadInput
    from splitleak.stopping import EXIT_TERMINATED, Terminated, sigterm_interrupts, stopped_by

    try:
        with sigterm_interrupts():  # SIGTERM as Ctrl-C: the parties checkpoint, then stop
            _warm_up(args)
            from orchestration.commands import cmd_run

            return cmd_run(args, console)
    except RunInUse as err:  # another process runs or analyses it (run.lock)
        raise BadInput(str(err)) from None
    except KeyboardInterrupt as err:
        console.print(f"[bold red]{stopped_by(err)}[/]: every party was stopped")
        return EXIT_TERMINATED if isinstance(err, Terminated) else EXIT_INTERRUPTED


def _warm_up(args: argparse.Namespace) -> None:
    """Start the zygote of the parties' processes when the command starts some: it imports
    while this process validates and prepares."""
    if _starts_parties(args):
        from orchestration.zygote_client import warm_up

        warm_up()


def _starts_parties(args: argparse.Namespace) -> bool:
    """Whether this command starts party processes (then it forks them from a zygote)."""
    if args.command == "run":
        return not args.in_process
    if args.command == "sweep":  # the in-process engine's workers fork too, unless --jobs 1
        engine = getattr(args, "engine", "local")
        return engine == "local" or (engine == "inprocess" and args.jobs != 1)
    return args.command in ("bench", "soak")


def _certs(args: argparse.Namespace, console: Console) -> int:
    """`splitleak certs`: a CA and one identity per party, never over existing ones unasked."""
    from splitleak import tls
    from splitleak.cli_common import BadInput
    from splitleak.fileio import describe_os_error

    if not 1 <= args.parties <= MAX_PARTIES or not 1 <= args.days <= MAX_CERT_DAYS:
        raise BadInput(f"splitleak certs: --parties must be 1..{MAX_PARTIES} and --days "
                       f"1..{MAX_CERT_DAYS} (got --parties {args.parties}, --days {args.days})")
    names = tls.identities(args.parties)
    _refuse_overwrite(args.directory, names, args.force)
    try:
        tls.generate(args.directory, names, args.days)
    except OSError as err:
        raise BadInput(f"splitleak certs: {describe_os_error(err)}") from None
    console.print(f"wrote ca.pem and {', '.join(names)} (.pem/.key) to {args.directory}")
    return 0


def _refuse_overwrite(directory: Path, names: list[str], force: bool) -> None:
    """Exit 2 naming the first CA or identity file already there, unless --force."""
    from splitleak.cli_common import BadInput

    files = [directory / "ca.pem", *(directory / f"{n}{s}" for n in names for s in (".pem", ".key"))]
    there = next((f for f in files if f.exists() or f.is_symlink()), None)
    if there is not None and not force:
        raise BadInput(f"splitleak certs: {there} already exists; give --force to replace the CA "
                       "and every identity (parties holding the old ones can no longer connect), "
                       "or choose another directory")


def _sweep_or_compare(args: argparse.Namespace, console: Console) -> int:
    if args.command == "compare":
        from orchestration.compare.command import cmd_compare

        return cmd_compare(args, console)
    from orchestration.study import run_study

    return run_study(args, console)


def entry() -> NoReturn:
    """The `splitleak` console script."""
    end_process(main)


if __name__ == "__main__":
    entry()
