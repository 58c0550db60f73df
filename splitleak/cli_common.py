"""What every entry point shares: logging, config loading with exit code 2, the exit codes."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from splitleak.config import ConfigError, ExperimentConfig, load_config
from splitleak.datasets import Schema
from splitleak.fileio import check_writable, describe_os_error

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
LOG_FORMAT = "%(asctime)s {role} %(levelname)s %(message)s"  # every process's log lines


class BadInput(SystemExit):
    """Exit with code 2 after printing what is wrong."""

    def __init__(self, message: str) -> None:
        print(message, file=sys.stderr)
        super().__init__(EXIT_BAD_INPUT)


def setup_logging(role: str, verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format=LOG_FORMAT.format(role=role), force=True)


def tls_dir_or_exit(cfg: ExperimentConfig, tls_dir: Path | None) -> Path | None:
    """The TLS identity directory this process must use, or None when the config says plaintext."""
    if not cfg.topology.tls:
        # Identities given to a plaintext run would be silently ignored: refuse. (An empty
        # directory, e.g. a compose volume `prepare` emptied for a plaintext run, holds none.)
        if tls_dir is not None and (tls_dir / "ca.pem").exists():
            raise BadInput(f"--tls-dir {tls_dir} holds TLS identities but the config says "
                           "topology.tls = false: set topology.tls = true to use mutual TLS, or "
                           "drop --tls-dir for plaintext on a trusted network")
        return None
    if tls_dir is None:
        raise BadInput("topology.tls = true: give --tls-dir DIR holding ca.pem and this party's "
                       "certificate and key (make them with `splitleak certs DIR --parties N`), "
                       "or set topology.tls = false for plaintext on a trusted network")
    return tls_dir


def config_or_exit(path: str | Path | None) -> ExperimentConfig:
    try:
        return load_config(path)
    except ConfigError as err:
        raise BadInput(str(err)) from None


def writable_or_exit(directory: Path) -> None:
    """Exit 2 in one sentence when this process could not write its outputs there."""
    try:
        check_writable(directory)
    except OSError as err:
        raise BadInput(f"the run directory is not writable: {describe_os_error(err)}") from None


def warn_config(cfg: ExperimentConfig, schema: Schema) -> list[str]:
    """Log what is allowed but probably a mistake (e.g. passive parties sharing columns)."""
    from splitleak.validation import overlap_warnings

    warnings = overlap_warnings(cfg, schema)
    for warning in warnings:
        logging.getLogger("splitleak").warning("%s", warning)
    return warnings
