"""The in-process engine: points trained by the in-process reference and analysed as the local
engine's worker does; one after another in the sweep's process at --jobs 1 (the fast tests), in
worker processes side by side at --jobs 2, with the local engine's numbers."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from orchestration.sweep.command import sweep_points
from orchestration.sweep.index import SweepIndex, read_index
from orchestration.sweep.inprocess import InProcessEngine
from orchestration.sweep.local import POINT_LOG, LocalEngine
from orchestration.sweep.points import Point
from orchestration.sweep.runner import run_points
from orchestration.sweep.spec import load_sweep
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.sweep import PointResult, read_result
from tests.conftest import tiny_sweep_file
from tests.runs import metrics_without_wall_clock


def tiny_points(root: Path, name: str) -> list[Point]:
    path = tiny_sweep_file(root, name)
    return sweep_points(load_sweep(path), path, root / "sweeps" / name)


def test_points_ran_here_one_after_another(inprocess_sweep: tuple[Path, str]) -> None:
    sweep_dir, _ = inprocess_sweep
    rows = read_index(sweep_dir)
    assert [(r["label"], r["status"], r["engine"]) for r in rows] == [
        ("none, seed=0", "done", "inprocess"), ("marvell, defense.0.s=4.0, seed=0", "done", "inprocess")]
    for row in rows:
        run = RunDir(sweep_dir / row["run_dir"])
        assert read_result(run.root) == PointResult("done", row["seconds"])
        assert json.loads(run.summary.read_text())["mode"] == "in-process"
        assert (run.report / "summary.json").exists()
        assert "report:" in (run.logs / POINT_LOG).read_text()  # the analysis printed there


class Recorder:
    """A listener that keeps what the engine told it and marks the index as a sweep does;
    Ctrl-C when a record matches `interrupt_at`."""

    def __init__(self, index: SweepIndex, interrupt_at: dict[str, Any],
                 raising: type[KeyboardInterrupt] = KeyboardInterrupt) -> None:
        self.index, self.interrupt_at, self.raising = index, interrupt_at, raising
        self.calls: list[tuple[str, str, Any]] = []

    def started(self, point: Point) -> None:
        self.calls.append(("started", point.label, None))
        self.index.mark(point, "running")

    def record(self, point: Point, record: dict[str, Any]) -> None:
        self.calls.append(("record", point.label, record["type"]))
        if self.interrupt_at.items() <= record.items():
            raise self.raising

    def finished(self, point: Point, result: PointResult) -> None:
        self.calls.append(("finished", point.label, result.status))
        self.index.mark(point, result.status, result.seconds, result.message)


def test_records_reach_the_progress_and_ctrl_c_stops_the_sweep(tmp_path: Path) -> None:
    points = tiny_points(tmp_path, "stopped")
    index = SweepIndex(points[0].run_dir.parent, points, "inprocess")
    recorder = Recorder(index, interrupt_at={"type": "train", "step": 1})
    with pytest.raises(KeyboardInterrupt):
        InProcessEngine(jobs=1).run(points, recorder)
    label = points[0].label
    assert recorder.calls == [("started", label, None), ("record", label, "plan"),
                              ("record", label, "train"), ("record", label, "train"),
                              ("finished", label, "interrupted")]
    assert [r["status"] for r in read_index(index.path.parent)] == ["interrupted", "pending"]
    assert read_result(points[0].run_dir).status == "interrupted"


def test_sigterm_stops_the_sweep_saying_so(tmp_path: Path) -> None:
    from splitleak.stopping import Terminated

    points = tiny_points(tmp_path, "terminated")
    index = SweepIndex(points[0].run_dir.parent, points, "inprocess")
    recorder = Recorder(index, interrupt_at={"type": "train", "step": 1}, raising=Terminated)
    with pytest.raises(Terminated):
        InProcessEngine(jobs=1).run(points, recorder)
    assert read_result(points[0].run_dir).message == "stopped by SIGTERM"


def _same_numbers(a: Path, b: Path) -> None:
    """metrics.jsonl (wall clock aside), the leak table and the summary's leak entries equal."""
    ours, theirs = RunDir(a), RunDir(b)
    assert metrics_without_wall_clock(ours) == metrics_without_wall_clock(theirs)
    leak = "attacker/leak.parquet"
    assert pq.read_table(a / leak).to_pylist() == pq.read_table(b / leak).to_pylist()
    assert (json.loads((ours.report / "summary.json").read_text())["leak"]
            == json.loads((theirs.report / "summary.json").read_text())["leak"])


@pytest.mark.slow
def test_the_local_engines_numbers_in_worker_processes_side_by_side(
        inprocess_sweep: tuple[Path, str], tmp_path: Path) -> None:
    """The same points through the local engine (every party a process, gRPC) and through the
    in-process engine's workers, two at a time: the numbers of the points run in this process."""
    sweep_dir, _ = inprocess_sweep
    here = [sweep_dir / row["run_dir"] for row in read_index(sweep_dir)]  # in point order
    for engine, name in ((LocalEngine(jobs=1), "local"), (InProcessEngine(jobs=2), "workers")):
        points = tiny_points(tmp_path, name)
        index = SweepIndex(points[0].run_dir.parent, points, engine.name)
        run_points(points, index, engine, show_progress=False)
        assert index.counts() == {"done": 2}, index.rows
        for ours, point in zip(here, points, strict=True):
            _same_numbers(ours, point.run_dir)
            mode = json.loads(RunDir(point.run_dir).summary.read_text())["mode"]
            assert (mode == "in-process") == (engine.name == "inprocess")


def test_a_stopped_point_runs_again_keeping_its_logs_and_a_trained_one_is_only_analysed(
        inprocess_sweep: tuple[Path, str], tmp_path: Path) -> None:
    """The in-process reference writes no checkpoints: a point stopped mid-training starts again
    from step 0 (its log says why, and goes on after the first attempt's), with the numbers of
    one never stopped; a point whose training had finished is only analysed."""
    sweep_dir, _ = inprocess_sweep
    points = tiny_points(tmp_path, "again")
    sweep = points[0].run_dir.parent
    with pytest.raises(KeyboardInterrupt):
        InProcessEngine(jobs=1).run(points, Recorder(SweepIndex(sweep, points, "inprocess"),
                                                     interrupt_at={"type": "train", "step": 1}))
    log = points[0].run_dir / "logs" / POINT_LOG
    with log.open("a") as out:  # the reference logs nothing this early: a line of its own
        out.write("the first attempt's line\n")
    first = log.read_text()
    outcome = run_points(points, SweepIndex(sweep, points, "inprocess"), InProcessEngine(jobs=1),
                         show_progress=False)
    assert outcome.counts == {"done": 2} and len(outcome.results) == 2
    again = log.read_text()
    assert again.startswith(first)
    assert ("the in-process reference writes no checkpoints; the point starts again from step 0"
            in again)
    for point, row in zip(points, read_index(sweep_dir), strict=True):
        _same_numbers(point.run_dir, sweep_dir / row["run_dir"])

    trained = RunDir(points[1].run_dir)  # stopped in its analysis: the index says interrupted
    metrics = trained.metrics.read_bytes()
    shutil.rmtree(trained.report)
    index = SweepIndex(sweep, points, "inprocess")
    index.mark(points[1], "interrupted")
    outcome = run_points(points, index, InProcessEngine(jobs=1), show_progress=False)
    assert list(outcome.results) == [points[1].hash] and outcome.counts == {"done": 2}
    assert "finished training: analysing it" in (trained.logs / POINT_LOG).read_text()
    assert trained.metrics.read_bytes() == metrics  # not trained again
    _same_numbers(trained.root, sweep_dir / read_index(sweep_dir)[1]["run_dir"])


def test_a_point_run_here_logs_as_a_worker_does(tmp_path: Path) -> None:
    """`--jobs 1` logs a point into its own log with the roles' filter: matplotlib's findfont
    fallbacks and other libraries' chatter stay out, the project's lines go in."""
    from orchestration.sweep.inprocess import _point_log

    run = RunDir(tmp_path / "point")
    with _point_log(run):
        logging.getLogger("matplotlib.font_manager").warning(
            "findfont: Font family ['STIXGeneral'] not found. Falling back to DejaVu Sans.")
        logging.getLogger("urllib3").info("chatter")
        logging.getLogger("orchestration.sweep").info("the point's own line")
    text = (run.logs / "sweep_point.log").read_text()
    assert "the point's own line" in text and "findfont" not in text and "chatter" not in text
