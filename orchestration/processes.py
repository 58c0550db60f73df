"""Child processes of the orchestrator: started in their own session, never left behind."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child before exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path
    essential: bool = True  # a failure of this child fails the run

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def last_error(self) -> str | None:
        """The last ERROR line the process logged, without its timestamp prefix."""
        for line in reversed(self.log_tail(200).splitlines()):
            if " ERROR " in line:
                return line.split(" ERROR ", 1)[1]
        return None


def spawn(name: str, args: list[str], log_path: Path, env: dict[str, str] | None = None,
          essential: bool = True) -> Child:
    """Start `python -m <args>` with stdout+stderr into `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=full_env, start_new_session=True,
                               preexec_fn=_die_with_parent)
    log.close()
    return Child(name, process, log_path, essential)


def stop_all(children: list[Child], grace: float = 5.0) -> None:
    """SIGTERM every live child, then SIGKILL whatever is still alive after `grace` seconds."""
    live = [c for c in children if c.returncode is None]
    for c in live:
        _signal(c, signal.SIGTERM)
    end = time.monotonic() + grace
    for c in live:
        try:
            c.process.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(c, signal.SIGKILL)
            c.process.wait()


def _signal(child: Child, sig: signal.Signals) -> None:
    try:
        os.killpg(child.process.pid, sig)
    except ProcessLookupError:
        pass
