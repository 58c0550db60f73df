"""The Ray engine on a real 3-node Ray cluster started on this machine (ray.cluster_utils):
a spread point puts every role on its own node and talks mutual TLS by node IP, its numbers
equal the local engine's for the same seed; a packed point writes into a shared directory."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from orchestration.sweep.engine import EngineError
from orchestration.sweep.index import SweepIndex, read_index
from orchestration.sweep.local import LocalEngine
from orchestration.sweep.points import Point, resolve
from orchestration.sweep.runner import run_points
from orchestration.sweep.spec import parse_sweep
from splitleak.artifacts.metrics import read_metrics
from splitleak.artifacts.paths import RunDir
from splitleak.config import parse_config
from tests.conftest import small_config

ray = pytest.importorskip("ray", reason="the Ray engine needs the optional extra splitleak[ray]")

from orchestration.sweep.ray_engine import RayEngine  # noqa: E402
from tests.ray_cluster import ray_cluster  # noqa: E402

pytestmark = pytest.mark.slow
NODES = 3
OBJECT_STORE = 80 * 1024 * 1024  # Ray's floor is ~75 MB; the runs' files stream in 4 MB pieces


@pytest.fixture(scope="module")
def cluster():
    """Three Ray nodes of one logical CPU each, all on this machine."""
    with ray_cluster(NODES, cpus=1, object_store=OBJECT_STORE) as address:
        ray.init(address=address, log_to_driver=False)
        yield address
        ray.shutdown()


def _points(tmp_path: Path, name: str, epochs: int = 1, **overrides) -> list[Point]:
    base = parse_config(small_config(
        tmp_path, training={"epochs": epochs}, attacker={"attacks": ["norm", "cosine_majority"]},
        **overrides))
    return resolve(parse_sweep({"sweep": {"name": name, "seeds": [5]}}), base, tmp_path / name)


def _run(points: list[Point], engine) -> SweepIndex:
    index = SweepIndex(points[0].run_dir.parent, points, engine.name)
    run_points(points, index, engine, console=Console(quiet=True), show_progress=False)
    return index


def _without_wall_clock(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall"} for r in records]


def test_spread_point_runs_each_role_on_its_own_node_with_the_local_numbers(cluster, tmp_path: Path) -> None:
    one_party = {"topology": {"passive_parties": 1, "tls": True}, "features": {"passive": [[0, 30]]}}
    (point,) = _points(tmp_path, "ray", **one_party)
    started = time.monotonic()
    index = _run([point], RayEngine(spread=True))
    ray_seconds = time.monotonic() - started
    (row,) = read_index(point.run_dir.parent)
    assert row["status"] == "done", row["message"]
    placed = json.loads((point.run_dir / "ray.json").read_text())
    assert placed["strategy"] == "STRICT_SPREAD"
    assert set(placed["seconds"]) == {"placement", "actors", "training", "streaming", "analysis"}
    nodes = placed["nodes"]
    assert set(nodes) == {"label_party", "attacker", "passive_party_1"}
    assert len({where["node_id"] for where in nodes.values()}) == NODES  # STRICT_SPREAD
    assert json.loads(row["nodes"]) == nodes and index.rows[point.hash]["engine"] == "ray"
    kept = json.loads((point.run_dir / "sweep_point.json").read_text())  # what a rebuilt row reads
    assert (kept["status"], kept["seconds"], kept["nodes"]) == ("done", row["seconds"], nodes)
    label_ip = nodes["label_party"]["ip"]
    assert f"listening on {label_ip}:" in (point.run_dir / "logs" / "label_party.log").read_text()
    for streamed in ("attacker/gradients/index.json", "passive_party_1/bottom.pt", "label_party/top.pt",
                     "logs/passive_party_1.log", "report/report.md"):
        assert (point.run_dir / streamed).exists(), streamed
    assert (point.run_dir / "tls" / "label-party.pem").exists()  # who took part
    assert not list(point.run_dir.rglob("*.key")), "a private key was left on disk"

    (twin,) = _points(tmp_path, "local", **one_party)
    assert twin.hash == point.hash  # the same experiment: only the engine differs
    started = time.monotonic()
    _run([twin], LocalEngine(jobs=1))
    print(f"\npoint wall time: ray (spread, 3 nodes) {ray_seconds:.1f} s, local "
          f"{time.monotonic() - started:.1f} s")
    assert read_index(twin.run_dir.parent)[0]["status"] == "done"
    ray_metrics = list(read_metrics(point.run_dir / "label_party" / "metrics.jsonl"))
    local_metrics = list(read_metrics(twin.run_dir / "label_party" / "metrics.jsonl"))
    assert _without_wall_clock(ray_metrics) == _without_wall_clock(local_metrics)
    ray_leak = json.loads((point.run_dir / "report" / "summary.json").read_text())
    local_leak = json.loads((twin.run_dir / "report" / "summary.json").read_text())
    assert ray_leak == local_leak
    assert (point.run_dir / "summary.json").exists()
    ray_summary = json.loads((point.run_dir / "summary.json").read_text())
    local_summary = json.loads((twin.run_dir / "summary.json").read_text())
    assert ray_summary["mode"] == "ray"
    # the start-up as the local engine's summary gives it (it lacked these four)
    assert set(ray_summary) == set(local_summary), set(local_summary) ^ set(ray_summary)
    assert set(ray_summary["startup_s"]) == set(local_summary["startup_s"])
    assert ray_summary["devices"] == local_summary["devices"]
    assert 0 < ray_summary["time_to_first_step_s"] < ray_summary["seconds"]
    assert ray_summary["launched_at"] > 0


def _scratch() -> set[Path]:
    """The roles' node-local scratch folders (not this process's zygote's socket folder, which
    lives as long as this process)."""
    return {p for p in Path(tempfile.gettempdir()).glob("splitleak-*")
            if not p.name.startswith("splitleak-zygote-")}


def test_packed_points_write_into_a_shared_directory(cluster, tmp_path: Path) -> None:
    points = _points(tmp_path / "shared", "packed", topology={"passive_parties": 2, "tls": False})
    scratch = _scratch()
    _run(points, RayEngine(shared_dir=tmp_path / "shared", cpus_per_role=0.5))
    (row,) = read_index(points[0].run_dir.parent)
    assert row["status"] == "done", row["message"]
    placed = json.loads((points[0].run_dir / "ray.json").read_text())
    assert placed["strategy"] == "PACK"
    assert set(placed["nodes"]) == {"label_party", "attacker", "passive_party_1", "passive_party_2"}
    assert (points[0].run_dir / "passive_party_2" / "bottom.pt").exists()
    assert (points[0].run_dir / "report" / "summary.json").exists()
    assert _scratch() <= scratch  # node-local scratch removed


def test_spread_needs_a_node_per_role(cluster, tmp_path: Path) -> None:
    points = _points(tmp_path, "wide", topology={"passive_parties": 2})  # 4 roles, 3 nodes
    with pytest.raises(EngineError, match="4 roles on its own node, but the cluster has 3 node"):
        RayEngine(spread=True).run(points, None)


@pytest.mark.timeout(300)
def test_a_point_larger_than_the_cluster_fails_at_once_saying_so(cluster, tmp_path: Path) -> None:
    """4 roles of 1 CPU on 3 one-CPU nodes can never be placed: the point fails at once with
    the numbers (it waited forever for its placement group before)."""
    points = _points(tmp_path, "too_big", topology={"passive_parties": 2})
    started = time.monotonic()
    _run(points, RayEngine())
    (row,) = read_index(points[0].run_dir.parent)
    assert row["status"] == "failed" and time.monotonic() - started < 60, row
    assert "needs 4 roles x 1 CPU, but the cluster's 3 node(s) (3 CPU in all) hold only 3" in (
        row["message"]), row["message"]


def test_a_role_that_fails_fails_its_point_with_the_reason(cluster, tmp_path: Path) -> None:
    points = _points(tmp_path, "broken", dataset={"name": "breast_cancer", "params": {"rows": 5}},
                     topology={"passive_parties": 1}, features={"passive": [[0, 30]]})
    _run(points, RayEngine(spread=True))
    (row,) = read_index(points[0].run_dir.parent)
    assert row["status"] == "failed"
    assert "label_party ended before serving" in row["message"] and "rows" in row["message"]
    assert json.loads((points[0].run_dir / "ray.json").read_text())["nodes"]["label_party"]


class _KillOnFirstStep(RayEngine):
    """kill -9 of one role's actor process once the point's first train step is recorded."""

    def __init__(self, victim: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.victim = victim
        self.killed: dict = {}

    def _place(self, *args):
        self.actors = super()._place(*args)
        return self.actors

    def started(self, point: Point) -> None:
        pass

    def record(self, point: Point, record: dict) -> None:
        if record.get("type") == "train" and not self.killed:
            self.killed = ray.get(self.actors[self.victim].where.remote())
            os.kill(self.killed["pid"], signal.SIGKILL)

    def finished(self, point: Point, result) -> None:
        self.result = result


@pytest.mark.timeout(300)
def test_a_killed_role_fails_its_point_naming_it_and_keeps_what_the_others_wrote(
        cluster, tmp_path: Path) -> None:
    """It failed with Ray's raw ActorDiedError, and the run directory kept no log nor outcome."""
    (point,) = _points(tmp_path, "killed", epochs=50, features={"passive": [[0, 30]]},
                       topology={"passive_parties": 1})
    engine = _KillOnFirstStep("passive_party_1")
    scratch = _scratch()
    engine.run([point], engine)
    # the survivors cleaned theirs; the dead one's stayed for ever, before the point's end
    # removed the point's scratch on its node
    assert _scratch() <= scratch, _scratch() - scratch
    where = engine.killed
    assert engine.result.status == "failed"
    assert engine.result.message.startswith(
        f"passive party 1 (Ray actor on node {where['node_id'][:8]} at {where['ip']}, pid "
        f"{where['pid']}) died: "), engine.result.message
    assert "\n" not in engine.result.message and "Some common causes" not in engine.result.message
    for kept in ("logs/label_party.log", "logs/attacker.log", "label_party/metrics.jsonl",
                 "label_party/outcome.json", "ray.json"):
        assert (point.run_dir / kept).exists(), kept
    assert json.loads((point.run_dir / "label_party" / "outcome.json").read_text())["party"] == 1


class _Answered:
    def remote(self, *args) -> Any:
        return ray.put(None)  # what a passive party's start() answers at once


class _KillBeforeItJoins(_KillOnFirstStep):
    """kill -9 of one role's actor once started, before its party could join."""

    def _train(self, point: Point, actors: dict, nodes: dict, *args):
        self.killed = nodes[self.victim]
        os.kill(self.killed["pid"], signal.SIGKILL)
        started = SimpleNamespace(start=_Answered(), poll=actors[self.victim].poll)
        return super()._train(point, {**actors, self.victim: started}, nodes, *args)


@pytest.mark.timeout(300)
def test_a_role_killed_before_its_party_joins_fails_its_point_in_seconds(
        cluster, tmp_path: Path) -> None:
    """The label party, waiting for the join, kept the point running its step deadline + 10 s."""
    (point,) = _points(tmp_path, "unjoined", features={"passive": [[0, 30]]},
                       topology={"passive_parties": 1})
    engine = _KillBeforeItJoins("passive_party_1")
    started = time.monotonic()
    engine.run([point], engine)
    assert engine.result.status == "failed", engine.result
    # it waited the step deadline + 10 s once the role had died (~37 s in all here; now ~15 s)
    assert time.monotonic() - started < point.config.topology.step_deadline_s + 5
    assert engine.result.message.startswith("passive party 1 (Ray actor on node "), engine.result.message


class _StopAfterCheckpoint:
    """A listener that marks the index as a sweep does and sends this process Ctrl-C once the
    point's label party has written a complete checkpoint and trained past it."""

    def __init__(self, index: SweepIndex) -> None:
        self.index, self.sent = index, False

    def started(self, point: Point) -> None:
        self.index.mark(point, "running")

    def record(self, point: Point, record: dict[str, Any]) -> None:
        from splitleak.checkpoint import latest

        if (not self.sent and record.get("type") == "train" and record["step"] >= 120
                and latest(point.run_dir) is not None):
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)

    def finished(self, point: Point, result: Any) -> None:
        self.index.mark(point, result.status, result.seconds, result.message, result.nodes)


def test_a_stopped_point_resumes_from_its_checkpoint_in_a_shared_directory(
        cluster, tmp_path: Path) -> None:
    from orchestration.sweep.inprocess import InProcessEngine
    from tests.runs import metrics_without_wall_clock

    def point_in(root: Path) -> Point:
        base = parse_config(small_config(
            root, training={"epochs": 30, "batch_size": 8, "eval_interval": 0, "checkpoint_every": 50},
            attacker={"attacks": ["norm"]}, topology={"passive_parties": 1, "tls": False},
            features={"passive": [[0, 30]]}))
        (point,) = resolve(parse_sweep({"sweep": {"name": "resumed", "seeds": [5]}}), base,
                           root / "resumed")
        return point

    point = point_in(tmp_path / "shared")
    engine = RayEngine(shared_dir=tmp_path / "shared", cpus_per_role=0.5)
    index = SweepIndex(point.run_dir.parent, [point], engine.name)
    with pytest.raises(KeyboardInterrupt):
        engine.run([point], _StopAfterCheckpoint(index))
    assert read_index(point.run_dir.parent)[0]["status"] == "interrupted"
    first = (point.run_dir / "logs" / "label_party.log").read_text().splitlines()[0]

    _run([point], engine)
    (row,) = read_index(point.run_dir.parent)
    assert row["status"] == "done", row["message"]
    logs = point.run_dir / "logs"
    assert "resuming the point's earlier attempt at step" in (logs / "sweep_point.log").read_text()
    label_log = (logs / "label_party.log").read_text()
    assert label_log.startswith(first) and "resuming at step" in label_log

    twin = point_in(tmp_path / "inprocess")  # never stopped
    _run([twin], InProcessEngine(jobs=1))
    assert metrics_without_wall_clock(RunDir(point.run_dir)) == metrics_without_wall_clock(
        RunDir(twin.run_dir))
    assert (json.loads((point.run_dir / "report" / "summary.json").read_text())["leak"]
            == json.loads((twin.run_dir / "report" / "summary.json").read_text())["leak"])


def test_each_points_analysis_gets_its_share_of_the_drivers_cores(tmp_path: Path, monkeypatch) -> None:
    """Up to `jobs` points analyse at once on the driver: each analysis's batch attacks get
    cores // jobs worker processes (SPLITLEAK_CORES), not every core each."""
    import threading

    from orchestration.sweep import ray_engine

    started: list[dict[str, str] | None] = []

    def spawned(name: str, args: list[str], log_path: Path, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        started.append(env)
        return SimpleNamespace(returncode=0, log_tail=lambda lines: "")

    monkeypatch.setattr(ray_engine, "spawn", spawned)
    monkeypatch.setattr(ray_engine, "read_result", lambda root: None)
    monkeypatch.setattr(ray_engine, "cores", lambda: 16)
    engine = RayEngine(jobs=3)
    run = RunDir(tmp_path / "point")
    result = engine._analyse(SimpleNamespace(label="p"), run, time.monotonic(), None,  # noqa: SLF001
                             threading.Event())
    assert started == [{"SPLITLEAK_CORES": "5"}] and result.status == "failed"
