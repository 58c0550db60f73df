"""Where a peer listens: `HOST:PORT`, or `@FILE`, the file its process writes once it serves.

`@FILE` lets every role of a run start at once: a party loads its data and builds its model
while the label party is still starting, and reads the address only when it must connect."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from pathlib import Path

from splitleak.arguments import host_port, parent_problem

POLL = 0.02  # s
log = logging.getLogger("splitleak")


class AddressError(RuntimeError):
    """The peer's address file did not appear in time; the message names it."""


class AddressFileError(ValueError):
    """An `@FILE` that cannot hold an address (a directory, not UTF-8 text); the message names it."""


def check_address(address: str, option: str, connect: bool = False) -> str:
    """`address` if it is HOST:PORT with a usable port (1..65535 to connect, 0..65535 to listen)."""
    try:
        return host_port(1 if connect else 0)(address)
    except argparse.ArgumentTypeError as err:
        raise ValueError(f"{option}: {err}") from None


def check_peer(value: str, option: str) -> str:
    """`value` if it is a peer's HOST:PORT or an `@FILE` that is missing (yet) or readable text."""
    if value.startswith("@"):
        try:
            _read(value)
        except AddressFileError as err:
            raise AddressFileError(f"{option}: {err}") from None
        return value
    return check_address(value, option, connect=True)


def check_address_file(path: Path | None, option: str) -> None:
    """ValueError when the file a process writes its address to could never be written."""
    if path is not None and path.is_dir():
        raise ValueError(f"{option} {path} is a directory; give the path of a file to write "
                         "the address to")
    if path is not None and (problem := parent_problem(path)) is not None:
        raise ValueError(f"{option} {path}: {problem}; give a file in a directory")


def _read(value: str) -> str | None:
    if not value.startswith("@"):
        return value
    path = Path(value[1:])
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise AddressFileError(f"address file {path} is a directory; give the file the peer "
                               "writes its HOST:PORT to") from None
    except UnicodeDecodeError:
        raise AddressFileError(f"address file {path} is not UTF-8 text; it must hold the "
                               "peer's HOST:PORT") from None
    except OSError as err:
        raise AddressFileError(f"cannot read address file {path}: {err.strerror}") from None
    return text or None


def _waiting(value: str, what: str, deadline_s: float) -> None:
    log.info("waiting up to %g s for the %s to write its address to %s", deadline_s, what,
             value[1:])


def _missing(value: str, what: str, deadline_s: float) -> AddressError:
    return AddressError(f"the {what} wrote no address to {value[1:]} within {deadline_s:g} s "
                        "(it did not start serving)")


async def resolve(value: str, what: str, deadline_s: float) -> str:
    """The address `value` names, waiting up to `deadline_s` for an `@FILE` to be written."""
    end = time.monotonic() + deadline_s
    if (address := _read(value)) is None:
        _waiting(value, what, deadline_s)
    while address is None:
        if time.monotonic() > end:
            raise _missing(value, what, deadline_s)
        await asyncio.sleep(POLL)
        address = _read(value)
    return address


def resolve_now(value: str, what: str, deadline_s: float) -> str:
    """`resolve` for code without an event loop."""
    end = time.monotonic() + deadline_s
    if (address := _read(value)) is None:
        _waiting(value, what, deadline_s)
    while address is None:
        if time.monotonic() > end:
            raise _missing(value, what, deadline_s)
        time.sleep(POLL)
        address = _read(value)
    return address
