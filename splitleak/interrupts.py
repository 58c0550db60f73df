"""Ctrl-C and SIGTERM held off while a short step that must not stop half-way runs to its end;
Ctrl-C raised at once inside an event loop whose coroutine never waits."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Inside, Ctrl-C and SIGTERM are ignored, so a bounded stop path runs to its end (a second
    Ctrl-C, or the one `timeout` passes on again, would leave it half done)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def interrupts_at_once() -> Iterator[None]:
    """Inside, Ctrl-C raises KeyboardInterrupt where the main thread is, as it does outside an
    event loop. asyncio.run only cancels its task on Ctrl-C, which a coroutine that never
    waits (the in-process reference's step loop) sees when it has run to its end."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield  # a worker thread, or Ctrl-C handled otherwise (ignored, or a caller's own)
        return
    signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
