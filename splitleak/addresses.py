"""Where a peer listens: `HOST:PORT`, or `@FILE`, the file its process writes once it serves.

`@FILE` lets every role of a run start at once: a party loads its data and builds its model
while the label party is still starting, and reads the address only when it must connect."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

POLL = 0.02  # s


class AddressError(RuntimeError):
    """The peer's address file did not appear in time; the message names it."""


def _read(value: str) -> str | None:
    if not value.startswith("@"):
        return value
    try:
        text = Path(value[1:]).read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


def _missing(value: str, what: str, deadline_s: float) -> AddressError:
    return AddressError(f"the {what} wrote no address to {value[1:]} within {deadline_s:g} s "
                        "(it did not start serving)")


async def resolve(value: str, what: str, deadline_s: float) -> str:
    """The address `value` names, waiting up to `deadline_s` for an `@FILE` to be written."""
    end = time.monotonic() + deadline_s
    while (address := _read(value)) is None:
        if time.monotonic() > end:
            raise _missing(value, what, deadline_s)
        await asyncio.sleep(POLL)
    return address


def resolve_now(value: str, what: str, deadline_s: float) -> str:
    """`resolve` for code without an event loop."""
    end = time.monotonic() + deadline_s
    while (address := _read(value)) is None:
        if time.monotonic() > end:
            raise _missing(value, what, deadline_s)
        time.sleep(POLL)
    return address
