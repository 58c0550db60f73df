"""How a command is stopped: Ctrl-C, or SIGTERM handled as Ctrl-C (the label party checkpoints
every party before they stop; an analysis leaves the previous one as it was), and the exit code
and words for each."""

from __future__ import annotations

import signal
import threading
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


class StopNoted:
    """The first Ctrl-C or SIGTERM that came while `stops_noted` held them (None: none yet)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:  # a second one while the first is being acted on changes nothing
            self.signum = signum

    def error(self) -> KeyboardInterrupt:
        """What a caller that acted on the stop raises: Terminated for SIGTERM."""
        return Terminated() if self.signum == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def stops_noted() -> Iterator[StopNoted]:
    """Inside (on the main thread), Ctrl-C and SIGTERM only note that they came; the caller
    polls `signum` and stops on its own terms, then raises `error()`.

    Python raises KeyboardInterrupt wherever the main thread is when its handler runs: inside a
    weakref callback or a __del__ (which Ray's object references and thread pools run) it is
    printed as 'Exception ignored in ...' and lost, and what waits for it waits on. A handler
    that only takes note cannot be lost so."""
    noted = StopNoted()
    if threading.current_thread() is not threading.main_thread():
        yield noted  # only the main thread handles signals: the caller's own stop applies
        return
    previous = {sig: signal.signal(sig, noted._note) for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) is not signal.SIG_IGN}  # an ignored one stays ignored
    try:
        yield noted
    finally:
        for sig, handler in previous.items():  # one installed from C reads None: the default
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
