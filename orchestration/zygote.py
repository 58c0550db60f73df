"""Start the roles by forking one pre-imported process (a zygote), not by starting Python anew.

`python -m label_party` spends seconds importing torch, gRPC and numpy before it does
anything, and a run starts N+2 such processes (a sweep point N+3): on a small machine their
imports queue behind each other and are most of a short run. The zygote imports them once
and forks a child per request; the child runs the module's `__main__` exactly as `python -m`
would, in a session of its own, its output in its own log, in the requester's environment
and directory. Nothing but imports ever runs in the zygote (no thread pool used, no CUDA
context, no gRPC channel), so a fork from it is as safe as one of PyTorch's DataLoader
workers, and a forked role may still initialise CUDA itself (the zygote answers
torch.cuda.is_available() through NVML, which starts no CUDA driver; tests/test_gpu.py has a
forked child compute on the GPU). The stdlib's forkserver does not fit: a child of it cannot
itself start processes through it (a sweep point's worker starts its own parties), and it
gives no session or log.

Requests and events are JSON lines over a Unix socket; any process that knows the socket
(``SPLITLEAK_ZYGOTE``) may ask, and is told when each of its children exits. When a client
disconnects, its children still running are stopped; when the process that started the
zygote ends (from whichever of its threads), the zygote stops every child and exits.

    python -m orchestration.zygote SOCKET_PATH
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import setproctitle

SOCKET_ENV = "SPLITLEAK_ZYGOTE"
# Imported once, before the first fork: everything a role imports at start-up.
# torch._dynamo: torch.optim's optimizers import it (and sympy) on first use, ≈ 1–2 s.
PRELOAD = ("torch", "torch._dynamo", "numpy", "grpc", "grpc.aio", "uvloop", "pydantic",
           "cryptography.x509", "label_party.cli", "passive_party.cli", "attacker.cli",
           "attacker.sidecar.server", "orchestration.cli", "orchestration.commands",
           "orchestration.sweep.worker", "orchestration.relay", "splitleak.validation")
# Imported while the zygote waits for requests, one module between two of them: what roles need
# later in a run (the first evaluation, the summary, the analysis), kept off the first fork.
LATER = ("sklearn.metrics", "sklearn.datasets", "pyarrow.parquet", "pandas", "dp_accounting",
         "attacker.analysis.analyze", "attacker.report.report", "orchestration.compare.command")
STOP_GRACE = 5.0  # s: a stopped client's children get this long after SIGTERM
POLL = 0.02  # s: how often exited children are reaped


@dataclass
class _Client:
    connection: socket.socket
    buffer: bytes = b""
    children: set[int] = field(default_factory=set)

    def send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            self.connection.sendall(json.dumps(message).encode() + b"\n")


def serve(path: str) -> None:
    """Import, listen on `path`, fork a child per request until the parent ends."""
    parent = os.getppid()
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    with contextlib.suppress(Exception):  # every role's validation runs every plug-in group's
        importlib.import_module("splitleak.plugins").plugin_groups()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    clients: dict[int, _Client] = {}  # by the connection's fd
    owner: dict[int, _Client] = {}  # child pid -> the client that asked for it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the orchestrator's to handle
    signal.signal(signal.SIGTERM, lambda *_: _end(path, owner))
    later = list(LATER)
    while os.getppid() == parent:
        ready, _, _ = select.select([listener, *(c.connection for c in clients.values())], [], [],
                                    POLL)
        if not ready and later:  # idle: one more module the roles will want
            with contextlib.suppress(ImportError):
                importlib.import_module(later.pop(0))
        for sock in ready:
            if sock is listener:
                connection, _ = listener.accept()
                clients[connection.fileno()] = _Client(connection)
                continue
            client = clients[sock.fileno()]
            data = b""
            with contextlib.suppress(OSError):
                data = sock.recv(1 << 16)
            if not data:  # the client is gone: so are the children it started
                _stop(sorted(client.children))
                for pid in client.children:
                    owner.pop(pid, None)
                del clients[sock.fileno()]
                sock.close()
                continue
            client.buffer += data
            while b"\n" in client.buffer:
                line, client.buffer = client.buffer.split(b"\n", 1)
                pid = _spawn(json.loads(line), listener, clients)
                client.children.add(pid)
                owner[pid] = client
                client.send({"spawned": pid})
        _reap(owner)
    _end(path, owner)


def _end(path: str, owner: dict[int, _Client]) -> None:
    """The process that started the zygote has ended (or stops it): so does every child."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    _stop(sorted(owner))
    os._exit(0)


def _reap(owner: dict[int, _Client]) -> None:
    """Tell each exited child's client how it ended (Popen's convention: -N for signal N) and
    the CPU time it used (a forked child is not the client's own, so getrusage misses it)."""
    while owner:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        client = owner.pop(pid, None)
        if client is not None:
            client.children.discard(pid)
            client.send({"exited": pid, "code": os.waitstatus_to_exitcode(status),
                         "cpu": usage.ru_utime + usage.ru_stime})


def _stop(pids: list[int]) -> None:
    """SIGTERM each child's process group, SIGKILL what is left after STOP_GRACE."""
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    remaining = set(pids)
    deadline = _now() + STOP_GRACE
    while remaining and _now() < deadline:
        for pid in list(remaining):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            remaining.discard(pid)
        select.select([], [], [], POLL)
    for pid in remaining:
        _signal_group(pid, signal.SIGKILL)


def _now() -> float:
    return time.monotonic()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _spawn(request: dict[str, Any], listener: socket.socket, clients: dict[int, _Client]) -> int:
    """Fork; the parent returns once the child leads its own session (so the client may
    signal its process group at once)."""
    ready_r, ready_w = os.pipe()
    # Everything imported so far out of the collector's reach, in the child too: otherwise a
    # full collection falling due in the child's start-up walks the whole inherited heap, each
    # object's header written, so every page of it copied (0.3-0.6 s before the label party
    # serves on 2 cores, whether it falls due depending on how many objects the imports made).
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        _child(request, [listener, *(c.connection for c in clients.values())], ready_w)
    os.close(ready_w)
    os.read(ready_r, 1)
    os.close(ready_r)
    return pid


def _child(request: dict[str, Any], sockets: list[socket.socket], ready: int) -> None:
    """Become `python -m MODULE ARGS…` with the request's log, environment and directory."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # `ps` shows the child as its command, not as the zygote (set before the environment
        # changes: the title takes the memory of the zygote's arguments and environment)
        setproctitle.setproctitle(" ".join([sys.executable, "-m", request["module"],
                                            *request["args"]]))
        os.setsid()
        for sock in sockets:
            sock.close()
        os.write(ready, b"x")
        os.close(ready)
        _die_with_parent()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(request["cwd"])
        started_with = os.environ.get("PYTHONPATH", "")
        os.environ.clear()
        os.environ.update(request["env"])
        _follow_python_path(started_with, os.environ.get("PYTHONPATH", ""))
        code = _run_module(request["module"], request["args"])
    except BaseException:  # noqa: BLE001 - whatever happens, this process ends here
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            import logging

            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _follow_python_path(started_with: str, asked: str) -> None:
    """sys.path as `python -m` would build it from the request's PYTHONPATH, not the zygote's:
    its entries in place of the zygote's own (a package of plug-ins on the requester's path is
    then found, its entry points included). Modules the zygote imported stay imported."""
    if asked == started_with:
        return
    ours = {os.path.abspath(p) for p in started_with.split(os.pathsep) if p}
    wanted = [os.path.abspath(p) for p in asked.split(os.pathsep) if p]
    kept = [p for p in sys.path if p not in ours or p in wanted]
    at = 1 if kept else 0  # after the directory `-m` puts first, as the interpreter does
    sys.path[:] = kept[:at] + [p for p in dict.fromkeys(wanted) if p not in kept] + kept[at:]
    importlib.invalidate_caches()
    from splitleak.plugins import plugin_groups
    from splitleak.registry import installed_entry_points

    installed_entry_points.cache_clear()  # the zygote scanned its own path's distributions
    plugin_groups.cache_clear()


def _run_module(module: str, args: list[str]) -> int:
    """`python -m module args`: its exit status, as the interpreter would give it."""
    import runpy
    import warnings

    # The zygote imported the module already (that is its point): runpy's warning that it
    # finds it in sys.modules would open every child's log.
    warnings.filterwarnings("ignore", message=r".* found in sys\.modules after import of package",
                            category=RuntimeWarning)
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        if exit_.code is None:
            return 0
        if isinstance(exit_.code, int):
            return exit_.code
        print(exit_.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _die_with_parent() -> None:
    """SIGTERM this child when the zygote ends (it ends with the process that started it)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m orchestration.zygote SOCKET_PATH", file=sys.stderr)
        return 2
    serve(args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
