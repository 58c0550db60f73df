"""The orchestrator's side of the zygote: start it, ask it for children, follow their exits."""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from orchestration.zygote import SOCKET_ENV

READY_TIMEOUT = 120.0  # s: the zygote's imports, on a loaded machine


class ZygoteUnavailable(RuntimeError):
    """The zygote is off, did not start, or stopped answering; start processes anew instead."""


class ZygoteChild:
    """A child the zygote forked, with the part of Popen's interface the orchestrator uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self.zygote.exits.get(self.pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.pump(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            self.zygote.pump(0.05 if left is None else min(0.05, left))
        return self.returncode  # type: ignore[return-value]


class Zygote:
    """A connection to a zygote; `process` is set when this process started it."""

    def __init__(self, path: str, process: subprocess.Popen | None = None) -> None:
        self.path = path
        self.process = process
        self.exits: dict[int, int] = {}
        self.children_cpu = 0.0  # CPU-s of the exited children this client asked for
        self._connection: socket.socket | None = None
        self._buffer = b""
        self._lock = threading.RLock()

    @classmethod
    def start(cls) -> Zygote:
        """Start a zygote beside this process; it imports while this process goes on."""
        directory = tempfile.mkdtemp(prefix="splitleak-zygote-")
        path = str(Path(directory) / "socket")
        # NVML answers torch.cuda.is_available() there without initialising a CUDA driver,
        # which a fork must never inherit (CUDA roles are started anew anyway).
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        env.pop(SOCKET_ENV, None)
        process = subprocess.Popen([sys.executable, "-m", "orchestration.zygote", path],
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        zygote = cls(path, process)
        atexit.register(zygote.close)
        return zygote

    def ready(self) -> None:
        """Wait until the zygote answers (its imports are done); ZygoteUnavailable if never."""
        with self._lock:
            self._connect()

    def _connect(self) -> socket.socket:
        if self._connection is not None:
            return self._connection
        end = time.monotonic() + READY_TIMEOUT
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise ZygoteUnavailable(f"the zygote exited with code {self.process.returncode}")
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connection.connect(self.path)
                self._connection = connection
                return connection
            except OSError:
                connection.close()
                if self.process is None or time.monotonic() > end:
                    raise ZygoteUnavailable(f"no zygote answers at {self.path}") from None
                time.sleep(0.02)

    def spawn(self, module: str, args: list[str], log_path: Path, env: dict[str, str]) -> ZygoteChild:
        """Fork `python -m module args` with its output appended to `log_path`."""
        request = {"module": module, "args": args, "log": str(log_path), "env": env,
                   "cwd": os.getcwd()}
        with self._lock:
            try:
                self._connect().sendall(json.dumps(request).encode() + b"\n")
                while True:
                    for message in self._read(timeout=READY_TIMEOUT):
                        if "spawned" in message:
                            return ZygoteChild(self, message["spawned"])
            except OSError as err:
                self._connection = None
                raise ZygoteUnavailable(f"the zygote stopped answering: {err}") from None

    def pump(self, timeout: float) -> None:
        """Record the exits the zygote has reported (waiting up to `timeout` for one)."""
        with self._lock:
            if self._connection is None:
                return
            for _ in self._read(timeout):
                pass

    def _read(self, timeout: float) -> list[dict]:
        """The next messages (at least one unless `timeout` passes); exits are recorded."""
        assert self._connection is not None
        ready, _, _ = select.select([self._connection], [], [], timeout)
        if not ready:
            return []
        data = self._connection.recv(1 << 16)
        if not data:
            raise OSError("the zygote closed the connection")
        self._buffer += data
        messages = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "exited" in message:
                self.exits[message["exited"]] = message["code"]
                self.children_cpu += message.get("cpu", 0.0)
            messages.append(message)
        return messages

    def close(self) -> None:
        """Disconnect; a zygote this process started stops (its children with it)."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None:
            shutil.rmtree(Path(self.path).parent, ignore_errors=True)


_current: Zygote | None = None
_current_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get(SOCKET_ENV, "") not in ("off", "0")


def current() -> Zygote | None:
    """This process's zygote: the one named in the environment (this process is itself one
    of its children), else one started now; None when SPLITLEAK_ZYGOTE=off."""
    global _current
    if not enabled():
        return None
    with _current_lock:
        if _current is None:
            named = os.environ.get(SOCKET_ENV)
            _current = Zygote(named) if named else Zygote.start()
            os.environ[SOCKET_ENV] = _current.path  # children ask the same zygote
        return _current


def process_cpu(pid: int) -> float:
    """CPU-s (user + system) a live process has used itself; 0.0 where /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def children_cpu() -> float:
    """CPU-s of every process this process had forked by its zygote, once they have ended (as
    getrusage(RUSAGE_CHILDREN) counts the processes it started itself), and of the zygote this
    process started while it lives (its imports and forks: this process's helper)."""
    if _current is None:
        return 0.0
    zygote = _current.process
    alive = zygote is not None and zygote.poll() is None
    return _current.children_cpu + (process_cpu(zygote.pid) if alive else 0.0)  # type: ignore[union-attr]


SETTLED_CPU = 0.05  # share of a core: below it over SETTLE_WINDOW, the zygote has stopped importing
SETTLE_WINDOW = 0.5  # s


def warm_up(wait: float = 0.0) -> None:
    """Start the zygote now, so that its imports overlap this process's own work; `wait` > 0:
    then wait up to that many seconds until it answers and has finished importing (its CPU
    settled), so that nothing measured later competes with its imports."""
    zygote = current()
    if zygote is None or wait <= 0:
        return
    end = time.monotonic() + wait
    try:
        zygote.ready()
    except ZygoteUnavailable:
        return  # the roles start anew; nothing of the zygote's to wait for
    if zygote.process is None:
        return
    before = process_cpu(zygote.process.pid)
    while time.monotonic() < end:
        time.sleep(SETTLE_WINDOW)
        now = process_cpu(zygote.process.pid)
        if now - before < SETTLED_CPU * SETTLE_WINDOW:
            return
        before = now
