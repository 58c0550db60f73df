"""`splitleak run`: every party as its own process on loopback, one run directory."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestration.processes import Child, spawn, stop_all
from orchestration.progress import MetricsTail, RunProgress
from splitleak import tls
from splitleak.config import ExperimentConfig
from splitleak.metrics_log import read_metrics
from splitleak.rundir import RunDir


class RunFailed(Exception):
    """The run did not finish; the message names the failing party and why."""


@dataclass
class RunOutcome:
    run: RunDir
    mode: str
    seconds: float
    train_steps: int
    final_eval: dict[str, Any] | None
    training_seconds: float = 0.0  # from the first batch to the last train step

    @property
    def steps_per_second(self) -> float:
        return self.train_steps / self.training_seconds if self.training_seconds else 0.0


def run_distributed(cfg: ExperimentConfig, run: RunDir, progress: RunProgress | None = None,
                    poll: float = 0.1, route: Callable[[str], str] | None = None) -> RunOutcome:
    """Start the label party, then the N passive parties; wait for all; raise RunFailed."""
    started = time.monotonic()
    port_file = run.label_party / "address"
    children: list[Child] = []
    tls_args: list[str] = []
    if cfg.topology.tls:  # a fresh CA and one identity per process, for this run only
        tls.generate(run.root / "tls", tls.identities(cfg.topology.passive_parties))
        tls_args = ["--tls-dir", str(run.root / "tls")]
    try:
        label = spawn("label party", ["label_party", "serve", "--config", str(run.config),
                                      "--run-dir", str(run.root), "--port-file", str(port_file),
                                      "--listen", cfg.topology.label_party_address, *tls_args],
                      run.logs / "label_party.log")
        children.append(label)
        observed = set(cfg.tapped_parties)
        sidecar = None
        if observed:  # started beside the label party: both import torch at the same time
            sidecar = spawn("attacker sidecar",
                            ["attacker", "serve", "--listen", "127.0.0.1:0", "--out", str(run.root),
                             "--config", str(run.config), "--run-id", run.root.name,
                             "--port-file", str(run.attacker / "address"), *tls_args],
                            run.logs / "attacker.log",
                            essential=cfg.attacker.on_sidecar_failure == "fail")
            children.append(sidecar)
        address = _wait_for_address(port_file, label, cfg.topology.join_deadline_s)
        if route is not None:  # e.g. through the benchmark's byte-counting relay
            address = route(address)
        sidecar_address = None
        if sidecar is not None:
            sidecar_address = _wait_for_address(run.attacker / "address", sidecar,
                                                cfg.topology.join_deadline_s)
        for k in range(1, cfg.topology.passive_parties + 1):
            tap = ["--attacker", sidecar_address] if sidecar_address and k in observed else []
            children.append(spawn(f"passive party {k}",
                                  ["passive_party", "run", "--config", str(run.config),
                                   "--party-id", str(k), "--label-party", address,
                                   "--run-dir", str(run.root), *tap, *tls_args],
                                  run.logs / f"passive_party_{k}.log"))
        _write_pids(run, children)
        _monitor(children, run, progress, cfg.topology.step_deadline_s + 10.0, poll)
    finally:
        stop_all(children)
    _raise_if_failed(children, run)
    return collect_outcome(run, "distributed", time.monotonic() - started)


def _write_pids(run: RunDir, children: list[Child]) -> None:
    """Which process is which party: for the user, and for the fault tests."""
    pids = {c.name: c.process.pid for c in children}
    (run.root / "pids.json").write_text(json.dumps(pids, indent=2))


def _wait_for_address(port_file: Path, child: Child, timeout: float) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if port_file.exists():
            return port_file.read_text().strip()
        if child.returncode is not None:
            raise RunFailed(f"{child.name} exited with code {child.returncode} before serving:\n"
                            f"{child.log_tail()}")
        time.sleep(0.05)
    raise RunFailed(f"{child.name} did not start serving within {timeout:g} s:\n{child.log_tail()}")


def _monitor(children: list[Child], run: RunDir, progress: RunProgress | None,
             failure_grace: float, poll: float) -> None:
    """Follow progress until every child exits; after a failure give the others a grace period
    to end on their own (the label party names the party that broke the run)."""
    tail = MetricsTail(run.metrics)
    failed_at: float | None = None
    while True:
        if progress is not None:
            for record in tail.read_new():
                progress.update(record)
        if all(c.returncode is not None for c in children if c.essential):
            _wait_briefly([c for c in children if not c.essential], timeout=failure_grace)
            return
        if failed_at is None and any(c.essential and c.returncode not in (None, 0)
                                     for c in children):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > failure_grace:
            return
        time.sleep(poll)


def _wait_briefly(children: list[Child], timeout: float) -> None:
    """Let non-essential children (the sidecar) finish writing before they are stopped."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(c.returncode is None for c in children):
        time.sleep(0.05)


def _raise_if_failed(children: list[Child], run: RunDir) -> None:
    if all(c.returncode == 0 for c in children if c.essential):
        return
    if run.outcome.exists():
        outcome = json.loads(run.outcome.read_text())
        if outcome.get("status") == "failed":
            raise RunFailed(f"{outcome['message']} [{outcome['code']}]")
    for child in children:
        if child.essential and child.returncode not in (0, None):
            reason = child.last_error() or child.log_tail()
            raise RunFailed(f"{child.name} exited with code {child.returncode}: {reason}")
    raise RunFailed("a party did not finish; see the logs in " + str(run.logs))


def collect_outcome(run: RunDir, mode: str, seconds: float) -> RunOutcome:
    final_eval = None
    steps, wall = 0, 0.0
    for record in read_metrics(run.metrics):
        if record["type"] == "eval":
            final_eval = record
        elif record["type"] == "train":
            steps, wall = record["step"] + 1, record["wall"]
    outcome = RunOutcome(run, mode, seconds, steps, final_eval, wall)
    run.summary.write_text(json.dumps({
        "run_id": run.root.name, "mode": mode, "seconds": seconds, "train_steps": steps,
        "training_seconds": wall, "steps_per_second": outcome.steps_per_second,
        "final_eval": final_eval,
    }, indent=2))
    return outcome
