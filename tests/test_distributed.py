"""The wire changes nothing: distributed runs equal the in-process reference, and
`splitleak run` trains, reports and cleans up after itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestration.reference import run_reference
from orchestration.run import run_distributed
from splitleak.artifacts.metrics import read_metrics
from splitleak.artifacts.paths import TIMING_FILE, RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.checkpoint import latest
from splitleak.config import parse_config
from splitleak.timing import WARMUP_STEPS
from tests.conftest import small_config, write_config

pytestmark = pytest.mark.slow


def _records(run: RunDir, kind: str) -> list[dict]:
    return [r for r in read_metrics(run.metrics) if r["type"] == kind]


def _assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if isinstance(a[name], torch.Tensor):
            torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(("parties", "overrides"), [
    (2, {}),
    (3, {"model": {"kind": "mlp", "layers": [8, 8], "cut_layer": 1, "aggregation": "sum"},
         "features": {"ratios": [2, 2, 1], "label_party": [0, 5]}}),
])
def test_distributed_equals_reference(tmp_path: Path, parties: int, overrides: dict) -> None:
    data = small_config(tmp_path, topology={"passive_parties": parties}, **overrides)
    cfg = parse_config(data)
    dist = create_run_dir(cfg, tmp_path / "dist")
    ref = create_run_dir(cfg, tmp_path / "ref")
    outcome = run_distributed(cfg, dist)
    run_reference(cfg, ref)

    dist_loss = [r["loss"] for r in _records(dist, "train")]
    ref_loss = [r["loss"] for r in _records(ref, "train")]
    assert len(dist_loss) == len(ref_loss) == outcome.train_steps > 0
    np.testing.assert_allclose(dist_loss, ref_loss, rtol=1e-6, atol=1e-7)
    for d, r in zip(_records(dist, "eval"), _records(ref, "eval"), strict=True):
        assert d["step"] == r["step"]
        assert d["test_auc"] == pytest.approx(r["test_auc"], abs=1e-6)
    _assert_same_state(torch.load(dist.top_model)["top"], torch.load(ref.top_model)["top"])
    for k in range(1, parties + 1):
        _assert_same_state(torch.load(dist.bottom_model(k))["model"],
                           torch.load(ref.bottom_model(k))["model"])
    assert outcome.final_eval is not None and outcome.final_eval["test_auc"] > 0.9
    timed_steps = outcome.train_steps - WARMUP_STEPS  # every role times its steps past warm-up
    for role, spans in [(dist.label_party, {"compute", "exchange", "encode", "decode", "update"}),
                        *((dist.passive_party(k), {"backward", "forward", "encode", "decode",
                                                    "wait", "write"})
                          for k in range(1, parties + 1))]:
        timing = json.loads((role / TIMING_FILE).read_text())
        assert timing["train_steps"] == timed_steps, role
        assert spans <= set(timing["spans"]) <= spans | {"tap"}, role  # tap: a tapped party
        assert all(s["seconds"] > 0 for s in timing["spans"].values()), role
        assert timing["cpu"]["user_ms_per_step"] > 0, role  # the process's CPU per step
    if cfg.tapped_parties:  # the sidecar: its CPU per train step, for the bench's budget
        sidecar = json.loads((dist.attacker / TIMING_FILE).read_text())
        assert sidecar["train_steps"] == timed_steps - 1
        assert sidecar["cpu"]["user_ms_per_step"] + sidecar["cpu"]["system_ms_per_step"] > 0


def test_same_seed_same_numbers_different_seed_differs(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path))
    a, b = create_run_dir(cfg, tmp_path / "a"), create_run_dir(cfg, tmp_path / "b")
    run_reference(cfg, a)
    run_reference(cfg, b)
    assert [r["loss"] for r in _records(a, "train")] == [r["loss"] for r in _records(b, "train")]
    other = parse_config(small_config(tmp_path, run={"name": "t", "seed": 4,
                                                      "output_dir": str(tmp_path)}))
    c = create_run_dir(other, tmp_path / "c")
    run_reference(other, c)
    assert [r["loss"] for r in _records(a, "train")] != [r["loss"] for r in _records(c, "train")]


def _cli(args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestration", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def _run_dir(base: Path, timeout: float = 60) -> Path:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = [p for p in base.glob("*/pids.json")]
        if found:
            return found[0].parent
        time.sleep(0.05)
    raise AssertionError("the run never started its parties")


def _wait_for_step(run: Path, step: int, timeout: float = 60) -> None:
    metrics = run / "label_party" / "metrics.jsonl"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if metrics.exists() and any(r["type"] == "train" and r["step"] >= step
                                    for r in read_metrics(metrics)):
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} never came")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not alive for our purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _slow_config(tmp_path: Path) -> Path:
    return write_config(tmp_path, small_config(
        tmp_path, training={"batch_size": 8, "epochs": 50, "eval_interval": 0},
        topology={"passive_parties": 2, "step_deadline_s": 5, "join_deadline_s": 30}))


def test_cli_run_trains_and_writes_run_directory(tmp_path: Path) -> None:
    path = write_config(tmp_path, small_config(tmp_path, topology={"passive_parties": 3},
                                               features={"ratios": [1, 1, 1]}))
    proc = _cli(["run", str(path), "--no-progress"])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    run = RunDir(next((tmp_path / "runs").iterdir()))
    assert "test AUC" in out and run.root.name in out
    for p in (run.config, run.metrics, run.labels, run.top_model, run.summary,
              run.bottom_model(1), run.bottom_model(3), run.logs / "passive_party_2.log"):
        assert p.exists(), p
    summary = json.loads(run.summary.read_text())
    assert summary["final_eval"]["test_auc"] > 0.9
    assert "hash" in run.config.read_text().splitlines()[0]
    # the label party says what it is doing before it listens, and how training ended
    lines = (run.logs / "label_party.log").read_text().splitlines()
    loading = next(i for i, line in enumerate(lines) if "label-party INFO loading data (" in line)
    assert loading < next(i for i, line in enumerate(lines) if "listening on" in line)
    assert any("training finished: ok (" in line for line in lines)


def test_failing_party_stops_every_process_and_names_it(tmp_path: Path) -> None:
    proc = _cli(["run", str(_slow_config(tmp_path)), "--no-progress"])
    run = _run_dir(tmp_path / "runs")
    pids = json.loads((run / "pids.json").read_text())
    _wait_for_step(run, 3)
    os.kill(pids["passive party 2"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "passive party 2" in out and "UNAVAILABLE" in out
    time.sleep(0.5)
    assert not [name for name, pid in pids.items() if _alive(pid)]


@pytest.mark.parametrize(("stop", "code", "words"), [(signal.SIGINT, 130, "stopped by Ctrl-C"),
                                                     (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_ctrl_c_or_sigterm_checkpoints_and_stops_every_process(
        tmp_path: Path, stop: signal.Signals, code: int, words: str) -> None:
    """SIGTERM (e.g. `timeout`) is Ctrl-C: the label party checkpoints every party at the step
    it stops at; before, every process got it at once and a party was blamed."""
    proc = _cli(["run", str(_slow_config(tmp_path)), "--no-progress"])
    run = _run_dir(tmp_path / "runs")
    pids = json.loads((run / "pids.json").read_text())
    _wait_for_step(run, 2)
    proc.send_signal(stop)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == code, out
    assert f"{words}: every party was stopped" in out and "resume" in out
    outcome = json.loads(RunDir(run).outcome.read_text())
    assert outcome["status"] == "interrupted" and "meanwhile" not in outcome.get("message", ""), outcome
    assert latest(run) is not None and latest(run).reason == "interrupted"
    time.sleep(0.5)
    assert not [name for name, pid in pids.items() if _alive(pid)]


def test_a_label_party_with_cores_to_spare_splits_its_backward_and_the_numbers_stay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a core for every process (SPLITLEAK_CORES says 8 here), the label party runs the
    backward pass to its own parameters after sending the cut gradients; the in-process
    reference never does. Same losses and models, bit for bit."""
    monkeypatch.setenv("SPLITLEAK_CORES", "8")
    cfg = parse_config(small_config(tmp_path, training={"max_steps": 12}))
    dist = create_run_dir(cfg, tmp_path / "dist")
    ref = create_run_dir(cfg, tmp_path / "ref")
    run_distributed(cfg, dist)
    run_reference(cfg, ref)
    assert json.loads((dist.label_party / TIMING_FILE).read_text())["split_backward"] is True
    assert [r["loss"] for r in _records(dist, "train")] == [r["loss"] for r in _records(ref, "train")]
    for name, value in torch.load(ref.top_model)["top"].items():
        assert torch.equal(value, torch.load(dist.top_model)["top"][name]), name
    for k in (1, 2):
        for name, value in torch.load(ref.bottom_model(k))["model"].items():
            assert torch.equal(value, torch.load(dist.bottom_model(k))["model"][name]), (k, name)
