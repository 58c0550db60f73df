"""`passive-party run`: one passive party as its own process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, NoReturn

from passive_party.client import (
    PartyDataChanged,
    PartyError,
    PartyStopped,
    StopRequest,
    run_party,
)
from splitleak.addresses import AddressFileError, check_peer
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import LinkedRunDir, refuse_symlinks
from splitleak.cli_common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    BadInput,
    checked_config_or_exit,
    die_of_sigterm,
    end_process,
    say_when_terminated,
    setup_logging,
    tls_dir_or_exit,
    writable_or_exit,
)
from splitleak.datasets import DatasetError
from splitleak.fileio import describe_os_error
from splitleak.tap import TapError
from splitleak.tls import passive_identity
from splitleak.transport import run_async

log = logging.getLogger("passive_party")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="passive-party", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="join a run and train this party's bottom model")
    r.add_argument("--config", required=True, help="experiment TOML file (same as the label party's)")
    r.add_argument("--party-id", type=int, required=True, help="this party's id, 1..N")
    r.add_argument("--label-party", required=True, help="label party address HOST:PORT "
                   "(or @FILE: the address its process writes once it serves)")
    r.add_argument("--run-dir", type=Path, default=Path("."),
                   help="where to save this party's bottom model and checkpoints (default: the "
                   "current directory)")
    r.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="the run directory holding this party's checkpoints, when the label "
                        "party resumes the run (replaces --run-dir)")
    r.add_argument("--attacker", metavar="HOST:PORT",
                   help="attacker sidecar to tap every received gradient to (or @FILE)")
    r.add_argument("--tls-dir", type=Path, help="TLS identities (ca.pem, passive-party-K.pem/.key)")
    r.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(f"passive-party-{args.party_id}", args.verbose)
    cfg = checked_config_or_exit(args.config, role_log=log)
    check_arguments(args, cfg.topology.passive_parties)
    tls_dir = tls_dir_or_exit(cfg, args.tls_dir, passive_identity(args.party_id))
    run = RunDir(args.resume or args.run_dir)
    if args.resume is not None:  # its checkpoints are written anew: never through a link
        try:
            refuse_symlinks(run.root, run.passive_party(args.party_id), run.checkpoints)
        except LinkedRunDir as err:
            raise BadInput(f"passive-party run --resume: {err}") from None
    writable_or_exit(run.root)
    say_when_terminated(lambda: f"passive party {args.party_id}: stopped by SIGTERM", log)
    try:
        stop = StopRequest()
        run_async(stoppable(run_party(cfg, args.party_id, args.label_party, run,
                                      attacker=args.attacker, tls_dir=tls_dir,
                                      resuming=args.resume is not None, stop=stop, watch=True),
                               stop))
    except Stopped as stop:
        log.warning("passive party %d: stopped by %s%s%s", args.party_id, stop.by,
                    "; the label party was told: the run stops (continue it with --resume on "
                    "every host)" if stop.told else "",
                    f" (meanwhile: {stop.then})" if stop.then else "")
        if stop.signum == signal.SIGTERM:  # die of it, as before: its status says SIGTERM
            die_of_sigterm()
        return EXIT_INTERRUPTED
    except AddressFileError as err:
        raise BadInput(f"passive-party run: {err}") from None
    except PartyDataChanged as err:  # the label party was told; put the data back, resume
        log.error("passive party %d: %s", args.party_id, err)
        return EXIT_BAD_INPUT
    except (PartyError, TapError) as err:
        log.error("passive party %d: %s", args.party_id, err)
        return EXIT_FAILED
    except DatasetError as err:
        log.error("passive party %d: DatasetError: %s", args.party_id, err)
        return EXIT_BAD_INPUT
    except OSError as err:
        log.error("passive party %d: %s", args.party_id, describe_os_error(err))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0


class Stopped(Exception):
    """Ctrl-C or SIGTERM stopped the party; `told`: the label party heard it; `then`: how the
    label party ended the run meanwhile (its own stop, e.g. every host stopped at once)."""

    def __init__(self, signum: int, told: bool, then: str | None = None) -> None:
        super().__init__(SIGNALS[signum])
        self.signum, self.by, self.told, self.then = signum, SIGNALS[signum], told, then


SIGNALS: dict[int, str] = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}
STOP_GRACE = 3.0  # s: a party in training stops at the label party's next message, or then


async def stoppable(party: Coroutine[Any, Any, None], request: StopRequest) -> None:
    """Run the party until Ctrl-C or SIGTERM (Stopped). In training it stops at the label
    party's next message, telling it by what (the label party said the party 'dropped its
    connection'); at once when not training yet, when the label party says nothing for
    STOP_GRACE seconds, or on a second signal. A label party or sidecar that ends the run first
    (stopped with this host: its checkpoint written) is no failure of a party being stopped."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(party)
    stopped: list[int] = []
    grace: list[asyncio.TimerHandle] = []

    def stop(signum: int) -> None:
        stopped.append(signum)
        if request.why is not None or not request.training:
            task.cancel()
            return
        request.why = f"interrupted on its host by {SIGNALS[signum]}"
        grace.append(loop.call_later(STOP_GRACE, end))

    def end() -> None:  # the grace is over: stop, unless a checkpoint it was asked for is unwritten
        if request.checkpointing:
            grace.append(loop.call_later(STOP_GRACE / 10, end))
        else:
            task.cancel()

    for signum in SIGNALS:
        loop.add_signal_handler(signum, stop, signum)
    try:
        await task
    except PartyStopped:
        raise Stopped(stopped[0], told=True) from None
    except (PartyError, TapError) as err:  # the label party (or sidecar) stopped with this host
        if not stopped:
            raise
        raise Stopped(stopped[0], told=False, then=str(err)) from None
    except asyncio.CancelledError:
        if not stopped:
            raise
        raise Stopped(stopped[0], told=False) from None
    finally:
        for handle in grace:  # the run may have ended meanwhile (its last message came first)
            handle.cancel()
        for signum in SIGNALS:
            loop.remove_signal_handler(signum)


def check_arguments(args: argparse.Namespace, parties: int) -> None:
    """Exit 2 naming the option when --party-id, an address or --resume cannot be used."""
    if not 1 <= args.party_id <= parties:
        raise BadInput(f"passive-party run: --party-id must be 1..{parties} (the config's "
                       f"topology.passive_parties), got {args.party_id}")
    try:
        check_peer(args.label_party, "--label-party")
        if args.attacker is not None:
            check_peer(args.attacker, "--attacker")
    except ValueError as err:
        raise BadInput(f"passive-party run: {err}") from None
    if args.resume is not None and not args.resume.is_dir():
        raise BadInput(f"passive-party run: --resume {args.resume} is not a directory (give the "
                       "run directory holding this party's checkpoints)")


def entry() -> NoReturn:
    """The `passive-party` console script."""
    end_process(main)
