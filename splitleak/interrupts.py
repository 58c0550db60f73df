"""Ctrl-C and SIGTERM held off while a short step that must not stop half-way runs to its end."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


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
