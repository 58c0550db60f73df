"""A process the orchestrator started ends when the orchestrator does (Linux PDEATHSIG).

The orchestrator names itself in ``SPLITLEAK_PARENT_PID``; the child arms the death signal
first thing in its ``__main__``, not in a ``preexec_fn``: Python code run between fork and
exec can deadlock when the parent has other threads (gRPC's, torch's), so none runs there.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "SPLITLEAK_PARENT_PID"
_PR_SET_PDEATHSIG = 1
_parent: int | None = None  # the orchestrator this process follows


def orphaned() -> bool:
    """Whether the orchestrator this process follows has ended (its death signal is then on
    its way, or here: what this process sees next is the stop, not a party's fault)."""
    return _parent is not None and os.getppid() != _parent


def follow_parent() -> None:
    """SIGTERM this process when the parent named in the environment ends; exit now if it
    already has. The variable is consumed, so processes this one starts do not inherit it."""
    named = os.environ.pop(PARENT_ENV, None)
    if named is None:
        return
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if not named.isdigit():
        sys.exit(f"{PARENT_ENV} must be the pid of the process that started this one, not {named!r}")
    if os.getppid() != int(named):  # it ended before the signal was armed
        sys.exit(f"the process that started this one (pid {named}) has already ended")
    global _parent
    _parent = int(named)
