"""One role of a point, hosted by an engine's worker (a Ray actor): the same per-service coroutine
the role's CLI runs (label_party.server.serve, passive_party.client.run_party,
attacker.sidecar.server.serve), in a thread of its own so the host can answer polls meanwhile.

Nothing here imports Ray; orchestration.sweep.ray_engine wraps a RoleHost in an actor.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Coroutine, Iterator
from contextlib import ExitStack, suppress
from functools import partial
from pathlib import Path
from typing import Any

from orchestration.launch import LABEL_PARTY, PASSIVE_PARTY, Role
from orchestration.launch import SIDECAR as ATTACKER
from orchestration.processes import last_error
from orchestration.sweep.scratch import SWEEP_FOLDER, remove_role_folder, scratch_of
from splitleak import tls
from splitleak.artifacts.metrics import MetricsTail
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import held_by, holding
from splitleak.cli_common import LOG_FORMAT
from splitleak.config import parse_config
from splitleak.fileio import write_atomically
from splitleak.placement import THREADS_ENV
from splitleak.transport import run_async

CHUNK_BYTES = 4 * 1024 * 1024  # streamed files travel in pieces this size
LAST_WORDS_BYTES = 64 * 1024  # how much of a failed role's log its reason is looked for in


def passive_role(party_id: int) -> str:
    return Role(PASSIVE_PARTY, party_id).key


class RoleError(RuntimeError):
    """The role could not start; the message says why."""


HELD = ".held"  # in a role's scratch folder: locked by the role's process while it lives
ABANDONED_AFTER_S = 60.0  # an unlocked role folder at least this old is one whose process died


def remove_abandoned() -> None:
    """Remove the scratch folders on this node of roles (of any sweep) whose process is gone
    though their driver did not remove them: a driver killed with SIGKILL, a task that never
    reached the node. A role's process holds a lock in its folder while it lives."""
    for lock in Path(tempfile.gettempdir()).glob(f"{SWEEP_FOLDER}*/*/*/{HELD}"):
        with suppress(OSError):  # removed meanwhile
            if held_by(lock) is None and time.time() - lock.stat().st_mtime > ABANDONED_AFTER_S:
                remove_role_folder(lock.parent)


class RoleHost:
    """Runs one role of one run. `run_root` is the run directory the role writes (a shared path,
    or None: a fresh node-local one named `run_name`, streamed back by `files`); `sweep` names
    the folder its node-local files go in (orchestration.sweep.scratch); `identity` is
    this role's TLS files by name (ca.pem, <name>.pem, <name>.key); the key is kept in memory.
    `resume`: continue the run in `run_root` from its newest complete checkpoint, as the role's
    CLI does with --resume."""

    def __init__(self, role: str, config_toml: str, run_name: str, run_root: str | None = None,
                 identity: dict[str, bytes] | None = None, cpus: float = 1.0,
                 resume: bool = False, sweep: str = f"{SWEEP_FOLDER}roles") -> None:
        os.environ[THREADS_ENV] = str(max(1, int(cpus)))  # "auto": the CPUs of its bundle
        self.role = role
        self.cfg = parse_config(tomllib.loads(config_toml), f"{run_name} ({role})")
        remove_abandoned()  # first: it removes a point's folder left empty, this one's too
        point = scratch_of(sweep, run_name)
        point.parent.mkdir(mode=0o700, exist_ok=True)
        point.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._scratch = Path(tempfile.mkdtemp(prefix=f"{role}-", dir=point))
        self._held = ExitStack()  # until cleanup: this folder is in use
        self._held.enter_context(holding(self._scratch / HELD, self._scratch, "using it"))
        self.streamed = run_root is None
        if resume and self.streamed:
            raise RoleError(f"{role} cannot resume a run it streams back (it has no earlier files)")
        self.resume = resume
        self.run = RunDir(self._scratch / run_name if run_root is None else Path(run_root))
        self.run.root.mkdir(parents=True, exist_ok=True)
        self.tls_dir: Path | None = None
        if identity:  # private keys stay in this process's memory, never on the node's disk
            self.tls_dir = self._scratch / "tls"
            self.tls_dir.mkdir(mode=0o700)
            for name, data in identity.items():
                if not name.endswith(".key"):
                    write_atomically(self.tls_dir / name, partial(Path.write_bytes, data=data),
                                     mode=0o600)
            for name in (n.removesuffix(".key") for n in identity if n.endswith(".key")):
                tls.hold(self.tls_dir, name, identity[f"{name}.pem"], identity[f"{name}.key"])
        self.log_path = self.run.logs / f"{role}.log"
        self._log_start = self.log_path.stat().st_size if self.log_path.is_file() else 0
        self._log = self._log_to(self.log_path)
        self._thread: threading.Thread | None = None
        self._code: int | None = None
        self._error: str | None = None
        self._tail = MetricsTail(self.run.metrics) if role == LABEL_PARTY else None

    def _log_to(self, path: Path) -> logging.Handler:
        """The role's log in the run directory, as `splitleak run` keeps one per process."""
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter(LOG_FORMAT.format(role=self.role.replace("_", "-"))))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        return handler

    def capture_output(self) -> None:
        """This process's stdout and stderr into the role's log, as `splitleak run` sends each
        party process's: for a host with a process of its own (a Ray actor), whose output went
        to Ray's files on its node (a crash's last words, a library's warnings), out of sight."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        log = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)

    def last_words(self) -> str | None:
        """The role's own reason for failing: its last ERROR line this attempt (else its last
        line), as the local engine names a failed process by its log."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(self._log_start, self.log_path.stat().st_size - LAST_WORDS_BYTES))
                return last_error(log.read().decode(errors="replace"), failed=True)
        except OSError:
            return None

    def start(self, host: str, label_party: str | None = None, attacker: str | None = None) -> str | None:
        """Start the role; a server role returns the HOST:PORT it listens on once it serves."""
        port_file = self._scratch / "address"
        listen = f"{host}:0"
        self._thread = threading.Thread(target=self._main, name=self.role, daemon=True,
                                        args=(self._coroutine(listen, port_file, label_party, attacker),))
        self._thread.start()
        if self.role not in (LABEL_PARTY, ATTACKER):
            return None
        deadline = time.monotonic() + self.cfg.topology.join_deadline_s
        while time.monotonic() < deadline:
            if port_file.exists():
                return port_file.read_text().strip()
            if self._code is not None:
                raise RoleError(f"{self.role} ended before serving: {self._error or 'no message'}")
            time.sleep(0.05)
        raise RoleError(f"{self.role} did not serve within {self.cfg.topology.join_deadline_s:g} s"
                        + (f"; its last words: {words}" if (words := self.last_words()) else ""))

    def _coroutine(self, listen: str, port_file: Path, label_party: str | None,
                   attacker: str | None) -> Coroutine[Any, Any, Any]:
        cfg = self.cfg
        if self.role == LABEL_PARTY:
            from label_party.server import serve
            from splitleak.checkpoint import resume_point

            manifest = resume_point(self.run.root, cfg) if self.resume else None
            return serve(cfg, self.run, listen, port_file, self.tls_dir, self.resume, manifest,
                         attacker=attacker)
        if self.role == ATTACKER:
            from attacker.sidecar.server import record_shapes
            from attacker.sidecar.server import serve as serve_sidecar

            return serve_sidecar(self.run.root, listen, set(cfg.tapped_parties), self.run.root.name,
                                 cfg.topology, port_file, self.tls_dir,
                                 resume=self.resume, receive=set(cfg.received_parties),
                                 shapes=record_shapes(cfg))
        from passive_party.client import run_party

        party_id = int(self.role.rsplit("_", 1)[1])
        if label_party is None:
            raise RoleError(f"{self.role} needs the label party's address")
        return run_party(cfg, party_id, label_party, self.run, attacker=attacker, tls_dir=self.tls_dir,
                         resuming=self.resume)

    def _main(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        try:
            code = run_async(coroutine)
            self._code = code if isinstance(code, int) else 0
            if self._code:
                words = self.last_words()
                self._error = (f"{self.role} exited with code {self._code}: "
                               f"{words or f'no reason given (see logs/{self.role}.log)'}")
        except Exception as err:  # noqa: BLE001 - reported to the driver, which names the role
            logging.getLogger(self.role).exception("%s failed", self.role)
            self._error = f"{self.role}: {type(err).__name__}: {err}"
            self._code = 1

    def poll(self) -> dict[str, Any]:
        """Whether the role ended (and how), plus the label party's new metrics records."""
        return {"done": self._code is not None, "code": self._code, "error": self._error,
                "records": self._tail.read_new() if self._tail is not None else []}

    def files(self) -> Iterator[tuple[str, int, bytes]]:
        """Every file the role wrote, as (path relative to the run directory, offset, bytes)."""
        if not self.streamed:
            return
        for path in sorted(p for p in self.run.root.rglob("*") if p.is_file()):
            relative = path.relative_to(self.run.root).as_posix()
            with path.open("rb") as f:
                offset = 0
                while True:
                    chunk = f.read(CHUNK_BYTES)
                    if not chunk and offset:
                        break
                    yield relative, offset, chunk
                    offset += len(chunk)
                    if len(chunk) < CHUNK_BYTES:
                        break

    def cleanup(self) -> None:
        logging.getLogger().removeHandler(self._log)
        self._log.close()
        remove_role_folder(self._scratch)
        self._held.close()


def receive(run_root: Path, pieces: Iterator[tuple[str, int, bytes]]) -> int:
    """Write streamed pieces into `run_root`; returns the bytes written. A path that leaves the
    run directory is refused (the pieces come from another process)."""
    written = 0
    root = run_root.resolve()
    for relative, offset, data in pieces:
        target = (root / relative).resolve()
        if root not in target.parents:
            raise RoleError(f"streamed file {relative!r} is outside the run directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("r+b" if offset else "wb") as f:
            f.seek(offset)
            f.write(data)
        written += len(data)
    return written
