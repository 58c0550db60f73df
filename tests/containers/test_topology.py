"""Every party in its own container (deploy/docker-compose.yml): a run ends with a leak
report on the host, and a passive party stopped mid-run fails the run by name, cleanly."""

from __future__ import annotations

import json
import subprocess
import time
import tomllib
from pathlib import Path

import pyarrow as pa
import pytest
import tomli_w

from tests.containers.harness import REPO, Topology, detect_compose, up_commands

pytestmark = [pytest.mark.containers, pytest.mark.timeout(2400)]

EXPERIMENT = REPO / "deploy" / "experiment.toml"
RUN_TIMEOUT_S = 900
PARTIES = ["label-party", "attacker", "passive-party-1", "passive-party-2"]


def metrics(run_dir: Path) -> list[dict]:
    """Every line of metrics.jsonl, each required to be complete, valid JSON."""
    text = (run_dir / "label_party" / "metrics.jsonl").read_text()
    assert text.endswith("\n"), "metrics.jsonl ends in a torn line"
    return [json.loads(line) for line in text.splitlines()]


def gradient_log(run_dir: Path, party: int) -> list[pa.RecordBatch]:
    """The sidecar's log of one party, read with pyarrow alone (no splitleak code)."""
    batches = []
    for shard in sorted((run_dir / "attacker" / "gradients" / f"party_{party}").glob("*.arrows")):
        with pa.OSFile(str(shard), "rb") as source:
            batches.extend(pa.ipc.open_stream(source))
    return batches


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "up_args" in metafunc.fixturenames:
        ways = up_commands(detect_compose())
        metafunc.parametrize("up_args", list(ways.values()), ids=list(ways))


def test_topology_trains_records_and_reports(topology: Topology, up_args: list[str]) -> None:
    started = time.monotonic()
    code = topology.run(*up_args, timeout=RUN_TIMEOUT_S)
    assert code == 0, f"compose exited {code}:\n{topology.output()}"
    print(f"`{' '.join(up_args)}` took {time.monotonic() - started:.0f} s: "
          + topology.timeline(["prepare", *PARTIES, "analysis", "report"]))

    for service in ["prepare", *PARTIES, "analysis", "report"]:
        state = topology.state(service)
        assert (state["Status"], state["ExitCode"]) == ("exited", 0), (service, state)
    assert "mutual TLS" in topology.container_logs("prepare")  # the default: topology.tls
    run_dir = topology.run_dir
    outcome = json.loads((run_dir / "label_party" / "outcome.json").read_text())
    assert outcome["status"] == "ok", outcome
    steps = outcome["train_steps"]
    assert 0 < steps <= 300, "deploy/experiment.toml should stay a small, fast run"

    records = metrics(run_dir)
    train = [r for r in records if r["type"] == "train"]
    assert [r["step"] for r in train] == list(range(steps))
    final = [r for r in records if r["type"] == "eval"][-1]
    assert final["test_auc"] > 0.8, final  # chance is 0.5

    # The sidecar holds what the passive-party-1 container received, one record per step.
    batches = gradient_log(run_dir, 1)
    logged_steps = [b.column("step")[0].as_py() for b in batches]
    assert logged_steps == list(range(steps))
    assert [b.num_rows for b in batches] == [r["batch_size"] for r in train]
    assert {"sample_id", "epoch", "step", "cut_gradient"} <= set(batches[0].schema.names)
    index = json.loads((run_dir / "attacker" / "gradients" / "index.json").read_text())
    assert index["run_id"] == topology.run_id and list(index["parties"]) == ["1"]
    tap = json.loads((run_dir / "passive_party_1" / "tap.json").read_text())
    assert tap["sent"] == tap["acknowledged"] == steps and tap["error"] is None, tap
    assert not (run_dir / "attacker" / "gradients" / "party_2").exists()
    for k in (1, 2):
        assert (run_dir / f"passive_party_{k}" / "bottom.pt").stat().st_size > 0

    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary, "empty leak summary"
    assert "leak" in (run_dir / "report" / "report.md").read_text().lower()
    assert tomllib.loads((run_dir / "config.toml").read_text())["run"]["name"] == "compose"


def test_wan_variant_trains_behind_shaping_relays(topology: Topology) -> None:
    """deploy/docker-compose.wan.yml with deploy/experiment.wan.toml: each passive party's
    connection crosses its relay container, which shapes it as the experiment's [network] says."""
    topology.compose_file = REPO / "deploy" / "docker-compose.wan.yml"
    topology.env["SPLITLEAK_CONFIG"] = str(REPO / "deploy" / "experiment.wan.toml")
    code = topology.run("up", "--no-build", "--exit-code-from", "report", "report",
                        timeout=RUN_TIMEOUT_S)
    assert code == 0, f"compose exited {code}:\n{topology.output()}"
    for k in (1, 2):
        log = topology.container_logs(f"relay-{k}")
        assert "one-way latency 25 ms, jitter 2 ms, bandwidth 100 Mbit/s" in log, log
    run_dir = topology.run_dir
    outcome = json.loads((run_dir / "label_party" / "outcome.json").read_text())
    assert outcome["status"] == "ok", outcome
    train = [r for r in metrics(run_dir) if r["type"] == "train"]
    steps = sorted(b["wall"] - a["wall"] for a, b in zip(train, train[1:], strict=False))
    # A train step needs the activation to arrive and the gradient to return: two one-way
    # trips of 25 ms each at least, whatever the machine's speed.
    assert steps[len(steps) // 2] >= 0.045, steps[len(steps) // 2]
    assert [b.column("step")[0].as_py() for b in gradient_log(run_dir, 1)] == list(range(len(train)))
    assert "network 25 ± 2 ms one-way, 100 Mbit/s" in (run_dir / "report" / "report.md").read_text()


def _fault_config(path: Path) -> float:
    """deploy/experiment.toml made long (it is stopped early) with a short step deadline;
    plaintext, so that the other test covers TLS and this one the plaintext path."""
    data = tomllib.loads(EXPERIMENT.read_text())
    data["training"].update(epochs=2000, eval_interval=500)
    data["topology"].update(step_deadline_s=15, tls=False)
    path.write_text(tomli_w.dumps(data))
    return data["topology"]["step_deadline_s"]


def _wait_for_training(topology: Topology, process: subprocess.Popen, min_steps: int,
                       timeout: float) -> None:
    path = topology.run_dir / "label_party" / "metrics.jsonl"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and sum('"type":"train"' in line
                                 for line in path.read_text().splitlines()) >= min_steps:
            return
        if process.poll() is not None:
            pytest.fail(f"compose exited ({process.returncode}) before training started:\n"
                        f"{topology.output()}")
        time.sleep(0.5)
    pytest.fail(f"no {min_steps} train steps within {timeout:g} s:\n{topology.output()}")


def test_stopped_passive_party_fails_the_run_by_name(topology: Topology, tmp_path: Path) -> None:
    config = tmp_path / "experiment.toml"
    deadline = _fault_config(config)
    topology.env["SPLITLEAK_CONFIG"] = str(config)
    original = config.read_text()
    process = topology.start("up", "--no-build", "--exit-code-from", "report", "report")
    started = time.monotonic()
    try:
        _wait_for_training(topology, process, min_steps=20, timeout=RUN_TIMEOUT_S)
        training_after = time.monotonic() - started
        written_config = (topology.run_dir / "config.toml").read_text()
        stopped_at = time.monotonic()
        victim = topology.container("passive-party-2")
        assert topology.state("passive-party-2")["Running"]
        stop = subprocess.run(["docker", "stop", "-t", "5", victim], capture_output=True,
                              text=True, timeout=60, check=False)
        assert stop.returncode == 0, stop.stderr
        stop_took = time.monotonic() - stopped_at
        while topology.state("label-party")["Running"]:
            assert time.monotonic() - stopped_at < deadline + 30, (
                "the label party is still running well past its step deadline")
            time.sleep(0.2)
        label_ended_after = time.monotonic() - stopped_at
        code = process.wait(RUN_TIMEOUT_S)
        compose_ended_after = time.monotonic() - stopped_at
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert code != 0, f"compose exited 0 although a party was stopped:\n{topology.output()}"
    print(f"20 train steps {training_after:.1f} s after `up`; docker stop took {stop_took:.1f} s "
          f"(passive-party-2 exit {topology.state('passive-party-2')['ExitCode']}); the label "
          f"party ended {label_ended_after:.1f} s and compose {compose_ended_after:.1f} s after "
          f"the stop began; compose exited {code}")
    if compose_ended_after > label_ended_after + 30:  # seen twice in CI with Compose v2: why
        print(f"compose ended late; its output:\n{topology.output()[-6000:]}")
    assert label_ended_after <= deadline + 20, label_ended_after
    assert topology.state("label-party")["ExitCode"] == 1
    run_dir = topology.run_dir
    outcome = json.loads((run_dir / "label_party" / "outcome.json").read_text())
    assert outcome["status"] == "failed" and outcome["party"] == 2, outcome
    assert "passive party 2" in outcome["message"], outcome
    print(f"outcome: {outcome['code']}: {outcome['message']}")
    assert "passive party 2" in topology.container_logs("label-party")
    assert "plaintext" in topology.container_logs("prepare")
    # What was written before the fault is intact.
    train = [r for r in metrics(run_dir) if r["type"] == "train"]
    assert len(train) >= 20 and [r["step"] for r in train] == list(range(len(train)))
    assert (run_dir / "config.toml").read_text() == written_config
    tomllib.loads(written_config)
    assert config.read_text() == original
    logged = [b.column("step")[0].as_py() for b in gradient_log(run_dir, 1)]
    assert logged == list(range(len(logged))) and len(logged) >= 20
    # Nothing ran after the failed training.
    assert not (run_dir / "report").exists()
