"""How a command is stopped: Ctrl-C, or SIGTERM handled as Ctrl-C (the label party checkpoints
every party before they stop; an analysis leaves the previous one as it was), and the exit code
and words for each."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

EXIT_TERMINATED = 128 + signal.SIGTERM  # 143, as a shell reports a process SIGTERM ended


class Terminated(KeyboardInterrupt):
    """SIGTERM to a run, a sweep or an analysis: what is running is stopped as on Ctrl-C."""


def stopped_by(err: BaseException) -> str:
    """What stopped the command, in words."""
    return "stopped by SIGTERM" if isinstance(err, Terminated) else "stopped by Ctrl-C"


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises Terminated (a KeyboardInterrupt) in the main thread while inside."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
