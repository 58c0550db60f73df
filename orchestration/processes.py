"""Child processes of the orchestrator: started in their own session, never left behind.

A child is forked from the zygote (orchestration/zygote.py: imports paid once) when one
answers, else started as a new `python -m` process; both behave the same to the caller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestration import zygote_client
from splitleak.lifeline import PARENT_ENV


@dataclass
class Child:
    name: str
    process: subprocess.Popen | zygote_client.ZygoteChild
    log_path: Path
    essential: bool = True  # a failure of this child fails the run
    serves: bool = False  # serves until stopped: never waited for
    stopped: bool = False  # the orchestrator signalled it while it was running
    exited_at: float | None = None  # when the orchestrator first saw it exited (monotonic)
    log_start: int = 0  # the log's size when it started: what came before is an earlier attempt's

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    @property
    def failed_on_its_own(self) -> bool:
        return self.returncode not in (None, 0) and not self.stopped

    def how_it_ended(self) -> str:
        code = self.returncode
        if code is not None and code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines this process wrote (a resumed run appends to its log: the
        attempt before is not this process's word)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self.log_start)
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def last_error(self) -> str | None:
        """The last ERROR line the process logged, without its timestamp prefix (or, if it
        exited with an error code but logged none, its last line: e.g. a traceback's end)."""
        return last_error(self.log_tail(200), self.returncode is not None and self.returncode > 0)


def last_error(log: str, failed: bool) -> str | None:
    """The last ERROR line of a process's `log`, without its timestamp prefix; where it logged
    none, its last line if it `failed` on its own (e.g. a traceback's end), else None."""
    lines = [line for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if " ERROR " in line:
            return line.split(" ERROR ", 1)[1]
    return lines[-1].strip() if lines and failed else None


def spawn(name: str, args: list[str], log_path: Path, env: dict[str, str] | None = None,
          essential: bool = True, serves: bool = False) -> Child:
    """Start `python -m <args>` with stdout+stderr into `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = _size(log_path)
    zygote = zygote_client.current()
    if zygote is not None:
        try:
            child = zygote.spawn(args[0], args[1:], log_path,
                                 {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
            return Child(name, child, log_path, essential, serves, log_start=start)
        except zygote_client.ZygoteUnavailable:
            pass  # e.g. its imports failed: start Python anew
    log = log_path.open("ab")
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid()), **(env or {})}
    # No preexec_fn: the child arms its own death signal (splitleak.lifeline), so no Python
    # code runs between fork and exec in this multi-threaded process.
    process = subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=full_env, start_new_session=True)
    log.close()
    return Child(name, process, log_path, essential, serves, log_start=start)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def stop_all(children: list[Child], grace: float = 5.0) -> None:
    """SIGTERM every live child, then SIGKILL whatever is still alive after `grace` seconds."""
    live = [c for c in children if c.returncode is None]
    for c in live:
        c.stopped = True
        _signal(c, signal.SIGTERM)
    end = time.monotonic() + grace
    for c in live:
        try:
            c.process.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(c, signal.SIGKILL)
            c.process.wait()


def stop_one(child: Child, timeout: float) -> bool:
    """SIGTERM one child and wait up to `timeout` for it to end on its own terms (the label
    party checkpoints first); True if it did."""
    if child.returncode is not None:
        return True
    child.stopped = True
    _signal(child, signal.SIGTERM)
    try:
        child.process.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _signal(child: Child, sig: signal.Signals) -> None:
    try:
        os.killpg(child.process.pid, sig)
    except ProcessLookupError:
        pass
