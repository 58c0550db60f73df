"""`label-party serve`: the label party as its own process."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import NoReturn

from label_party.server import serve
from splitleak.addresses import (
    AddressError,
    AddressFileError,
    check_address,
    check_address_file,
    check_peer,
)
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import RunInUse, create_run_dir, serving, write_config
from splitleak.checkpoint import CheckpointError, Manifest, resume_point
from splitleak.cli_common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    BadInput,
    checked_config_or_exit,
    end_process,
    setup_logging,
    tls_dir_or_exit,
    writable_or_exit,
)
from splitleak.config import ExperimentConfig
from splitleak.datasets import DatasetError
from splitleak.fileio import describe_os_error
from splitleak.tls import LABEL_PARTY
from splitleak.transport import ListenError, check_listen, run_async

log = logging.getLogger("label_party")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="label-party", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve one training run")
    s.add_argument("--config", help="experiment TOML file (with --resume: default the run's own)")
    s.add_argument("--listen", help="HOST:PORT (default: topology.label_party_address)")
    s.add_argument("--run-dir", type=Path, help="run directory (default: a new one under "
                   "run.output_dir)")
    s.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="continue this run from its newest complete checkpoint")
    s.add_argument("--port-file", type=Path, help="write the bound HOST:PORT here once serving")
    s.add_argument("--tls-dir", type=Path, help="TLS identities (ca.pem, label-party.pem/.key)")
    s.add_argument("--attacker", metavar="HOST:PORT", help="attacker sidecar that records what "
                   "this party receives from the threat model's receiver victims (or @FILE)")
    s.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging("label-party", args.verbose)
    if args.config is None and args.resume is None:
        raise BadInput("label-party serve: give --config FILE (or --resume RUN_DIR)")
    check_addresses(args)
    cfg = checked_config_or_exit(args.config or RunDir(args.resume).config, role_log=log)
    tls_dir = tls_dir_or_exit(cfg, args.tls_dir, LABEL_PARTY)
    listen = args.listen or cfg.topology.label_party_address
    manifest: Manifest | None = None
    if args.resume is not None:
        run = RunDir(args.resume)
        try:
            manifest = resume_point(run.root, cfg)
        except CheckpointError as err:
            raise BadInput(f"--resume: {err}") from None
        writable_or_exit(run.label_party)
    else:
        try:
            check_listen(listen)  # before a run directory is made for it
        except ListenError as err:
            raise BadInput(f"label party: {err}") from None
        run = prepare_run_dir(cfg, args.run_dir)
    try:
        with serving(run):
            if args.resume is not None:  # held: a run in use is named so, not its port
                check_listen(listen)  # before the data loads
            return run_async(serve(cfg, run, listen,
                                   args.port_file, tls_dir, args.resume is not None, manifest,
                                   args.attacker))
    except RunInUse as err:
        raise BadInput(f"label party: {err}") from None
    except (ListenError, AddressFileError) as err:
        raise BadInput(f"label party: {err}") from None
    except OSError as err:
        raise BadInput(f"label party: {describe_os_error(err)}") from None
    except CheckpointError as err:
        raise BadInput(f"--resume: {err}") from None
    except DatasetError as err:
        raise BadInput(f"label party: DatasetError: {err}") from None
    except AddressError as err:
        log.error("label party: %s", err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def check_addresses(args: argparse.Namespace) -> None:
    """Exit 2 naming the option when --listen, --attacker or --port-file cannot be used."""
    try:
        if args.listen is not None:
            check_address(args.listen, "--listen")
        if args.attacker is not None:
            check_peer(args.attacker, "--attacker")
        check_address_file(args.port_file, "--port-file")
    except ValueError as err:
        raise BadInput(f"label-party serve: {err}") from None


def prepare_run_dir(cfg: ExperimentConfig, run_dir: Path | None) -> RunDir:
    """A new run directory, or the given one (its config written if it has none yet)."""
    try:
        if run_dir is None:
            return create_run_dir(cfg)
        run = RunDir(run_dir)
        writable_or_exit(run.root)
        trained = next((f for f in (run.outcome, run.metrics) if f.exists() and f.stat().st_size), None)
        if trained is not None:
            raise BadInput(f"label party: {run.root} already holds a run (it has "
                           f"{trained.relative_to(run.root)}): continue it with --resume "
                           f"{run.root}, or give a new --run-dir")
        if not run.config.exists():
            write_config(cfg, run)
        return run
    except OSError as err:
        raise BadInput(f"label party: {describe_os_error(err)}") from None


def entry() -> NoReturn:
    """The `label-party` console script."""
    end_process(main)
