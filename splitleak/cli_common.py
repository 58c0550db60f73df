"""What every entry point shares: logging, config loading with exit code 2, the exit codes."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from splitleak.config import ConfigError, ExperimentConfig, load_config
from splitleak.fileio import check_writable, describe_os_error

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# The attacker sidecar ended because a party it records stopped and said why: that party's
# failure (the orchestrator names it, not the sidecar that may exit first).
EXIT_PARTY_STOPPED = 3
LOG_FORMAT = "%(asctime)s {role} %(levelname)s %(message)s"  # every process's log lines


def die_of_sigterm() -> NoReturn:
    """End this process by SIGTERM's default action, so that its status says SIGTERM (after a
    handler has logged why)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    raise SystemExit(128 + signal.SIGTERM)  # not reached: the signal ends the process


def say_when_terminated(line: Callable[[], str], logger: logging.Logger) -> None:
    """On SIGTERM, log `line()` as a warning, then die of it: without it a role's log ended
    with no word of why. Only the main thread gets signals, so elsewhere it does nothing."""
    def stopped(signum: int, frame: object) -> None:
        logger.warning("%s", line())
        die_of_sigterm()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stopped)


class BadInput(SystemExit):
    """Exit with code 2 after printing what is wrong."""

    def __init__(self, message: str) -> None:
        print(message, file=sys.stderr)
        super().__init__(EXIT_BAD_INPUT)


def end_process(main: Callable[[], int | None]) -> NoReturn:
    """Run a console entry point and end the process with the code it chose, every time.

    Python's own exit tears the interpreter down while native threads (pyarrow's I/O pool,
    gRPC's pollers, torch's workers) may still run: one that then asks for the GIL calls
    pthread_exit through C++ frames, and the process aborts (SIGABRT, 134: "terminate called
    without an active exception") after it printed the right message. So: run the atexit
    handlers and flush what was written, then leave with os._exit, which does not tear down.
    Everything a normal exit does before its teardown still happens, in the same order:
    non-daemon threads are joined (threading._shutdown, e.g. executors finishing their work),
    then the atexit handlers run (e.g. Ray's shutdown).
    """
    code: int | str | None
    try:
        code = main()
    except SystemExit as stop:
        code = stop.code
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BaseException:  # noqa: BLE001 - a bug: show it as Python would, then exit 1
        traceback.print_exc()
        code = EXIT_FAILED
    if code is None:
        code = EXIT_OK
    elif not isinstance(code, int):  # sys.exit("message"): printed, exit 1
        print(code, file=sys.stderr)
        code = EXIT_FAILED
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        # A second Ctrl-C would stop a handler half-way (a zygote left running, "Exception
        # ignored in atexit callback"); each is bounded (e.g. the zygote's 10 s), so finish them.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        atexit._run_exitfuncs()
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code & 0xFF)


WIDE_OUTPUT = 160  # columns of a console that is no terminal (a file, a pipe, a CI log)


def command_console() -> Console:
    """The commands' console: a terminal's own width; WIDE_OUTPUT columns into a file or a pipe,
    where rich's 80 cut the wide tables' cells to '…' (COLUMNS, when set, wins)."""
    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(width=WIDE_OUTPUT)


# This project's loggers (by the first part of their name): each of their lines is shown.
OWN_LOGGERS = frozenset({"root", "splitleak", "orchestration", "label_party", "passive_party",
                         "attacker", "sweep", "relay", "compare"})


class LibraryChatter(logging.Filter):
    """Keeps this project's lines; of other libraries' only warnings and worse, and of those not
    matplotlib's findfont fallbacks (a font cache built by a matplotlib without its own fonts
    gives ~20 a report; the text is drawn in DejaVu Sans all the same). torch's "FakeTensor
    cache stats" (INFO, at exit) and the like stay off the terminal and the roles' logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.split(".", 1)[0] in OWN_LOGGERS:
            return True
        findfont = record.name == "matplotlib.font_manager" and str(record.msg).startswith("findfont:")
        return record.levelno >= logging.WARNING and not findfont


def setup_logging(role: str, verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format=LOG_FORMAT.format(role=role), force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(LibraryChatter())


def tls_dir_or_exit(cfg: ExperimentConfig | None, tls_dir: Path | None,
                    identity: str) -> Path | None:
    """The TLS identity directory this process must use (its identity `identity` loaded, so a
    missing file is refused now), or None when the config (or, without one, the absence of
    --tls-dir) says plaintext. A --tls-dir that cannot be used is refused, never ignored."""
    plaintext = not cfg.topology.tls if cfg is not None else tls_dir is None
    if plaintext:
        # Identities given to a plaintext run would be silently ignored: refuse. (An empty
        # directory, e.g. a compose volume `prepare` emptied for a plaintext run, holds none.)
        if tls_dir is not None and (not tls_dir.is_dir() or any(tls_dir.iterdir())):
            what = ("holds files" if tls_dir.is_dir() else
                    "is a file, not a directory," if tls_dir.exists() else "does not exist")
            raise BadInput(f"--tls-dir {tls_dir} {what} but the config says topology.tls = false: "
                           "set topology.tls = true to use mutual TLS, or drop --tls-dir for "
                           "plaintext on a trusted network")
        return None
    if tls_dir is None:
        raise BadInput("topology.tls = true: give --tls-dir DIR holding ca.pem and this party's "
                       "certificate and key (make them with `splitleak certs DIR --parties N`), "
                       "or set topology.tls = false for plaintext on a trusted network")
    from splitleak import tls

    try:
        tls.claim(tls_dir, identity)
    except OSError as err:
        reason = str(err) if err.strerror is None else f"cannot read {err.filename}: {err.strerror}"
        raise BadInput(f"--tls-dir {tls_dir}: {reason}") from None
    except tls.IdentityError as err:
        raise BadInput(f"--tls-dir {tls_dir}: {err}") from None
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
        from splitleak.arguments import output_dir_problem

        problem = output_dir_problem(directory)  # e.g. a file where a directory is
        raise BadInput(f"the run directory is not writable: {problem or describe_os_error(err)}") \
            from None


def checked_config_or_exit(path: str | Path | None, read_values: bool = False,
                           role_log: logging.Logger | None = None) -> ExperimentConfig:
    """The config at `path` (or the built-in default) through the one validation, resolved, its
    warnings logged; exit 2 naming the field. Every CLI loads its config this way; a role
    (`role_log`) says why in one log line, like the rest of its log."""
    from splitleak.validation import validate

    cfg = config_or_exit(path)
    try:
        checked = validate(cfg, read_values)
    except ConfigError as err:
        message = f"invalid config {path or '(built-in default)'}: {err}"
        if role_log is None:
            raise BadInput(message) from None
        role_log.error("%s", message)
        raise SystemExit(EXIT_BAD_INPUT) from None
    log_warnings(checked.warnings)
    return checked.cfg


def log_warnings(warnings: list[str]) -> None:
    """Log what validation found allowed but probably a mistake (e.g. parties sharing columns)."""
    for warning in warnings:
        logging.getLogger("splitleak").warning("%s", warning)
