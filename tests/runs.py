"""Helpers for tests that drive `splitleak run` as a user would: start, wait, fault, compare."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacker.sidecar.store import GradientLog
from splitleak.artifacts.metrics import MetricsError, read_metrics
from splitleak.artifacts.paths import RunDir
from tests.conftest import scaled

WALL_CLOCK = ("wall",)  # metrics fields that differ between any two runs


def cli(*args: str, **kwargs: Any) -> subprocess.Popen:
    """`splitleak ...` in a child process (stdout and stderr together, as text)."""
    return subprocess.Popen([sys.executable, "-m", "orchestration", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def run_dir(base: Path, timeout: float = 120) -> RunDir:
    """The run directory `splitleak run` created under `base`, once its parties are started."""
    end = time.monotonic() + scaled(timeout)
    while time.monotonic() < end:
        found = list(base.glob("*/pids.json"))
        if found:
            return RunDir(found[0].parent)
        time.sleep(0.05)
    raise AssertionError("the run never started its parties")


def pids(run: RunDir, timeout: float = 60) -> dict[str, int]:
    """Which process is which party (pids.json of the current attempt)."""
    return json.loads((run.root / "pids.json").read_text())


def last_train_step(run: RunDir) -> int:
    """The last train step in metrics.jsonl so far (-1: none yet). Read while the run writes
    it: a resumed attempt cuts the file back to its checkpoint and appends, and a read that
    spans the cut lands mid-record (not a record: read again at the next poll)."""
    try:
        steps = [r["step"] for r in read_metrics(run.metrics) if r["type"] == "train"] \
            if run.metrics.exists() else []
    except MetricsError:
        return -1
    return max(steps, default=-1)


def wait_for_step(run: RunDir, step: int, proc: subprocess.Popen | None = None,
                  timeout: float = 120) -> None:
    end = time.monotonic() + scaled(timeout)
    while time.monotonic() < end:
        if last_train_step(run) >= step:
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended before step {step}:\n{proc.communicate()[0]}")
        time.sleep(0.02)
    raise AssertionError(f"step {step} never came")


@contextmanager
def held_by_another(lock: Path) -> Iterator[None]:
    """`lock` held as another splitleak process holds it (flock, its pid 4242 written)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"4242\n")
        yield
    finally:
        os.close(fd)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, OSError):
        return False


def metrics_without_wall_clock(run: RunDir) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in read_metrics(run.metrics)]


def assert_same_state(a: Any, b: Any, where: str = "") -> None:
    """Equal bit for bit: tensors with torch.equal, everything else with ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def logged(run: RunDir, side: str = "gradients"
           ) -> dict[int, list[tuple[int, int, np.ndarray, dict[str, np.ndarray]]]]:
    """A sidecar log read back: `gradients` (the passive parties' taps) or `received` (the
    label party's); empty when the run has none."""
    if not (run.attacker / side).exists():
        return {}
    log = GradientLog(run.attacker / side)
    return {p: [(b.epoch, b.step, b.sample_ids, b.tensors) for b in log.batches(p)]
            for p in log.parties()}


def assert_same_run(a: RunDir, b: RunDir, parties: int) -> None:
    """Final parameters, metrics.jsonl (but wall-clock fields) and the gradient log's records
    read back in order are equal bit for bit."""
    assert metrics_without_wall_clock(a) == metrics_without_wall_clock(b)
    assert_same_state(torch.load(a.top_model), torch.load(b.top_model), "top.pt")
    for k in range(1, parties + 1):
        assert_same_state(torch.load(a.bottom_model(k)), torch.load(b.bottom_model(k)),
                          f"passive_party_{k}/bottom.pt")
    for side in ("gradients", "received"):
        log_a, log_b = logged(a, side), logged(b, side)
        assert log_a.keys() == log_b.keys(), side
        for party in log_a:
            assert len(log_a[party]) == len(log_b[party]), f"{side} party {party}: record count"
            for (ea, sa, ia, ta), (eb, sb, ib, tb) in zip(log_a[party], log_b[party], strict=True):
                assert (ea, sa) == (eb, sb)
                assert np.array_equal(ia, ib), f"{side} party {party} step {sa}: sample ids"
                assert ta.keys() == tb.keys()
                for name in ta:
                    assert np.array_equal(ta[name], tb[name]), f"{side} party {party} step {sa}: {name}"
    outcome_a, outcome_b = (json.loads(r.outcome.read_text()) for r in (a, b))
    assert outcome_a["status"] == outcome_b["status"] == "ok"
    assert outcome_a["defenses"] == outcome_b["defenses"]
    assert outcome_a["objective"] == outcome_b["objective"]


def reference_run(data: dict[str, Any]) -> RunDir:
    """Train `data`'s experiment in-process into a fresh run directory (the reference)."""
    from orchestration.reference import run_reference
    from splitleak.artifacts.rundir import create_run_dir
    from splitleak.config import parse_config

    cfg = parse_config(data)
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    return run


def distributed_and_reference(tmp_path: Path, data: dict[str, Any]) -> tuple[RunDir, RunDir]:
    """The config `data` trained by `splitleak run` (every party its own process) and by the
    in-process reference; their run directories."""
    from orchestration.reference import run_reference
    from splitleak.artifacts.rundir import create_run_dir
    from splitleak.config import parse_config
    from tests.conftest import write_config

    result = subprocess.run([sys.executable, "-m", "orchestration", "run", "--no-progress",
                             str(write_config(tmp_path, data))],
                            capture_output=True, text=True, timeout=scaled(300))
    assert result.returncode == 0, result.stdout + result.stderr
    distributed = RunDir(next((tmp_path / "runs").iterdir()))
    cfg = parse_config(data)
    reference = create_run_dir(cfg, tmp_path / "ref")
    run_reference(cfg, reference)
    return distributed, reference
