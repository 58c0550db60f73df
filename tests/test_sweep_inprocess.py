"""The in-process engine: points trained by the in-process reference and analysed as the local
engine's worker does; one after another in the test's process at --jobs 1 (the fast tests), in
worker processes beside each other at --jobs 2, and with the local engine's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from orchestration.sweep.engine import PointResult, read_result
from orchestration.sweep.index import SweepIndex, read_index
from orchestration.sweep.inprocess import InProcessEngine
from orchestration.sweep.local import POINT_LOG, LocalEngine
from orchestration.sweep.points import Point, resolve
from orchestration.sweep.runner import run_points
from orchestration.sweep.spec import parse_sweep
from splitleak.config import parse_config
from splitleak.rundir import RunDir
from tests.conftest import small_config
from tests.runs import metrics_without_wall_clock


def tiny_points(tmp_path: Path, name: str = "s", seeds: tuple[int, ...] = (0,)) -> list[Point]:
    """No defense and Marvell on breast_cancer, a few steps each."""
    base = small_config(tmp_path, training={"epochs": 1, "max_steps": 4, "eval_interval": 2},
                        attacker={"attacks": ["norm"]})
    sweep = parse_sweep({"sweep": {"name": name, "seeds": list(seeds)},
                         "variant": [{"name": "none"},
                                     {"name": "marvell", "set": {"defense": [{"name": "marvell"}]},
                                      "axes": {"defense.0.s": [4.0]}}]})
    return resolve(sweep, parse_config(base), tmp_path / name)


class Recorder:
    """A listener that keeps what the engine told it."""

    def __init__(self, interrupt_at: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.interrupt_at = interrupt_at

    def started(self, point: Point) -> None:
        self.calls.append(("started", point.label, None))

    def record(self, point: Point, record: dict[str, Any]) -> None:
        self.calls.append(("record", point.label, record["type"]))
        if self.interrupt_at is not None and self.interrupt_at.items() <= record.items():
            raise KeyboardInterrupt

    def finished(self, point: Point, result: PointResult) -> None:
        self.calls.append(("finished", point.label, result.status))


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Point], Recorder, dict]:
    """Two tiny points run one after another in this process."""
    points = tiny_points(tmp_path_factory.mktemp("inprocess"))
    recorder = Recorder()
    results = InProcessEngine(jobs=1).run(points, recorder)
    return points, recorder, results


def test_points_run_one_after_another_in_this_process(here) -> None:
    points, recorder, results = here
    assert [r.status for r in results.values()] == ["done", "done"]
    events = [(kind, label) for kind, label, _ in recorder.calls if kind != "record"]
    assert events == [("started", points[0].label), ("finished", points[0].label),
                      ("started", points[1].label), ("finished", points[1].label)]
    records = [kind for what, label, kind in recorder.calls if what == "record" and label == points[0].label]
    assert records[0] == "plan" and records.count("train") == 4 and "eval" in records  # the progress
    for point in points:
        run = RunDir(point.run_dir)
        assert read_result(run.root) == PointResult("done", results[point.hash].seconds)
        assert json.loads(run.summary.read_text())["mode"] == "in-process"
        assert (run.report / "summary.json").exists()
        assert "report:" in (run.logs / POINT_LOG).read_text()  # the analysis printed there


def test_ctrl_c_marks_the_point_interrupted_and_propagates(tmp_path: Path) -> None:
    points = tiny_points(tmp_path)
    index = SweepIndex(tmp_path / "s", points, "inprocess")
    recorder = Recorder(interrupt_at={"type": "train", "step": 1})
    with pytest.raises(KeyboardInterrupt):
        InProcessEngine(jobs=1).run(points, _Marking(index, recorder))
    assert [r["status"] for r in read_index(tmp_path / "s")] == ["interrupted", "pending"]
    assert read_result(points[0].run_dir).status == "interrupted"


class _Marking(Recorder):
    """Marks the index as the sweep's progress does."""

    def __init__(self, index: SweepIndex, inner: Recorder) -> None:
        self.index, self.inner = index, inner

    def started(self, point: Point) -> None:
        self.index.mark(point, "running")

    def record(self, point: Point, record: dict[str, Any]) -> None:
        self.inner.record(point, record)

    def finished(self, point: Point, result: PointResult) -> None:
        self.index.mark(point, result.status, result.seconds, result.message)


def _same_numbers(a: Path, b: Path) -> None:
    """metrics.jsonl (wall clock aside), the leak table and the summary's leak entries equal."""
    ours, theirs = RunDir(a), RunDir(b)
    assert metrics_without_wall_clock(ours) == metrics_without_wall_clock(theirs)
    leak = "attacker/leak.parquet"
    assert pq.read_table(a / leak).to_pylist() == pq.read_table(b / leak).to_pylist()
    assert (json.loads((ours.report / "summary.json").read_text())["leak"]
            == json.loads((theirs.report / "summary.json").read_text())["leak"])


@pytest.mark.slow
def test_the_local_engines_numbers_in_worker_processes_side_by_side(here, tmp_path: Path) -> None:
    """The same points through the local engine (every party a process, gRPC) and through the
    in-process engine's workers, two at a time: the numbers of the points run here."""
    done, _, _ = here
    for engine, name in ((LocalEngine(jobs=1), "local"), (InProcessEngine(jobs=2), "workers")):
        points = tiny_points(tmp_path, name)
        index = SweepIndex(tmp_path / name, points, engine.name)
        run_points(points, index, engine, show_progress=False)
        assert index.counts() == {"done": 2}, index.rows
        for ours, point in zip(done, points, strict=True):
            _same_numbers(ours.run_dir, point.run_dir)
            mode = json.loads(RunDir(point.run_dir).summary.read_text())["mode"]
            assert (mode == "in-process") == (engine.name == "inprocess")
