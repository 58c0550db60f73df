"""`label-party serve`: the label party as its own process."""

from __future__ import annotations

import argparse
from pathlib import Path

from label_party.server import serve
from label_party.validate import check_chain
from splitleak.cli_common import (
    EXIT_INTERRUPTED,
    BadInput,
    config_or_exit,
    setup_logging,
    tls_dir_or_exit,
)
from splitleak.config import ConfigError
from splitleak.rundir import RunDir, create_run_dir, write_config
from splitleak.transport import run_async
from splitleak.validation import check_core


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="label-party", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve one training run")
    s.add_argument("--config", required=True, help="experiment TOML file")
    s.add_argument("--listen", help="HOST:PORT (default: topology.label_party_address)")
    s.add_argument("--run-dir", type=Path, help="run directory (default: a new one under "
                   "run.output_dir)")
    s.add_argument("--port-file", type=Path, help="write the bound HOST:PORT here once serving")
    s.add_argument("--tls-dir", type=Path, help="TLS identities (ca.pem, label-party.pem/.key)")
    s.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging("label-party", args.verbose)
    cfg = config_or_exit(args.config)
    tls_dir = tls_dir_or_exit(cfg, args.tls_dir)
    try:
        check_core(cfg)
        check_chain(cfg)
    except ConfigError as err:
        raise BadInput(str(err)) from None
    if args.run_dir is None:
        run = create_run_dir(cfg)
    else:
        run = RunDir(args.run_dir)
        run.root.mkdir(parents=True, exist_ok=True)
        if not run.config.exists():
            write_config(cfg, run)
    try:
        return run_async(serve(cfg, run, args.listen or cfg.topology.label_party_address,
                               args.port_file, tls_dir))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
