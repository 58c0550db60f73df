"""The fault matrix (issue 13, items 1, 4 and 7): kill -9 and SIGSTOP of each role (label
party, a passive party, the sidecar) at a seeded random step early, in the middle and late in
a run of real processes, each followed by `splitleak run --resume`; the finished run equals
an uninterrupted one bit for bit, and every failure message names the process that failed.

Each chain puts three faults into one run (one per window, a different role each time), so
the nine (role, window) cells of a fault kind take three chains rather than nine runs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from splitleak.artifacts.paths import RunDir
from tests.conftest import scaled, small_config, write_config
from tests.runs import alive, assert_same_run, cli, pids, run_dir, wait_for_step

pytestmark = pytest.mark.slow

# 54 train steps: breast_cancer, 427 train rows in batches of 8, one epoch
# A checkpoint follows each window; the late one ends two checkpoints before the run does, so
# a fault the test sends a little after its step (on a loaded machine) still lands mid-run.
WINDOWS = {"early": (3, 14), "middle": (20, 33), "late": (36, 43)}
ROLES = ("label party", "passive party", "attacker sidecar")
DEADLINE = scaled(4)


def fault_config(tmp_path: Path) -> Path:
    return write_config(tmp_path, small_config(
        tmp_path, training={"batch_size": 8, "epochs": 1, "eval_interval": 15,
                            "checkpoint_every": 5},
        defense=[{"name": "discrete_sgd", "bins": 6}],
        attacker={"record_first_layer": True, "attacks": ["norm"]},  # a quick analysis
        topology={"tls": True, "step_deadline_s": DEADLINE, "join_deadline_s": scaled(60)}))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    """The same run with no fault at all."""
    tmp_path = tmp_path_factory.mktemp("baseline")
    proc = cli("run", str(fault_config(tmp_path)), "--no-progress")
    out, _ = proc.communicate(timeout=scaled(300))
    assert proc.returncode == 0, out
    return RunDir(next((tmp_path / "runs").iterdir()))


def _chain(index: int) -> list[tuple[str, str]]:
    """(window, role) of each fault: a rotation, so each kind covers every cell once."""
    return [(window, ROLES[(index + i) % len(ROLES)]) for i, window in enumerate(WINDOWS)]


def _process(role: str, chain: int) -> str:
    return f"passive party {chain % 2 + 1}" if role == "passive party" else role


def _restart(run: RunDir, old: dict[str, int]) -> subprocess.Popen:
    proc = cli("run", "--resume", str(run.root), "--no-progress")
    end = time.monotonic() + scaled(120)
    while pids(run) == old:
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()[0]
        time.sleep(0.05)
    return proc


def _ended(proc: subprocess.Popen, run: RunDir, before: dict[str, int]) -> str:
    out, _ = proc.communicate(timeout=scaled(180))
    assert proc.returncode == 1, out
    time.sleep(0.5)
    assert not [name for name, pid in before.items() if alive(pid)], "a process was left behind"
    return out


def _expect_named(out: str, role: str, process: str, kind: str) -> None:
    text = " ".join(out.split())  # the console wraps long lines
    if kind == "kill":
        assert f"run failed: {process} was killed by SIGKILL" in text, text
    elif role == "attacker sidecar":
        assert "attacker sidecar" in text and "failed" in text, text
    else:
        # stopped mid-step, or at a checkpoint boundary (then it is the acknowledgement it owes)
        # the stalled party leads, not a party the label party sent away meanwhile
        assert (f"run failed: {process} sent no activation" in text or f"run failed: {process} sent "
                "no acknowledgement of the checkpoint" in text) and "DEADLINE_EXCEEDED" in text, text


@pytest.mark.parametrize("kind", ["kill", "stop"])
@pytest.mark.parametrize("chain", [0, 1, 2])
def test_fault_chain_resumes_bit_for_bit(tmp_path: Path, baseline: RunDir, kind: str,
                                         chain: int) -> None:
    rng = np.random.default_rng([chain, kind == "stop"])
    proc = cli("run", str(fault_config(tmp_path)), "--no-progress")
    run = run_dir(tmp_path / "runs")
    for window, role in _chain(chain):
        low, high = WINDOWS[window]
        step = int(rng.integers(low, high))
        process = _process(role, chain)
        wait_for_step(run, step, proc)
        current = pids(run)
        target = current[process]
        if kind == "kill":
            os.kill(target, signal.SIGKILL)
        else:
            os.kill(target, signal.SIGSTOP)
            if role == "label party":  # the parties wait; nobody may be blamed for it
                time.sleep(DEADLINE + 3)
                os.kill(target, signal.SIGCONT)
                continue
        out = _ended(proc, run, current)
        _expect_named(out, role, process, kind)
        proc = _restart(run, current)
    out, _ = proc.communicate(timeout=scaled(300))
    assert proc.returncode == 0, out
    assert_same_run(baseline, run, parties=2)
