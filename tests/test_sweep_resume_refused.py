"""A sweep never resumes a point onto other data or past a lost gradient log, and never throws
the point's checkpoints away to start it over: the point fails, naming why, its run directory
left as it was (engine.resume_run_dir)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestration.sweep.engine import ResumeRefused, resume_run_dir
from orchestration.sweep.local import LocalEngine
from orchestration.sweep.points import Point
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.sweep import read_result
from splitleak.checkpoint import complete_manifests
from tests.test_resume_data import interrupted_run, spam_config, spam_file


def _contents(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and p.parent.name != "logs"}


@pytest.fixture
def started_in_a(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spam_file(tmp_path / "A" / "spam.data", seed=0)
    spam_file(tmp_path / "B" / "spam.data", seed=1)
    cfg = spam_config(tmp_path, "spam.data")
    monkeypatch.chdir(tmp_path / "A")
    run = interrupted_run(cfg, tmp_path / "run")
    assert complete_manifests(run.root)
    return cfg, run, tmp_path


def _refused(point: Point, *texts: str) -> None:
    before = _contents(point.run_dir)
    with pytest.raises(ResumeRefused) as caught:
        resume_run_dir(point)
    message = " ".join(str(caught.value).split())
    assert all(text in message for text in texts), message
    assert _contents(point.run_dir) == before  # nothing removed nor cut back


def test_a_sweep_resumed_from_another_directory_keeps_the_checkpoints(
        started_in_a, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, run, base = started_in_a
    monkeypatch.chdir(base / "B")  # the sweep is run again from another folder
    point = Point(0, "v", (), (), cfg, run.root)
    _refused(point, f"now names {base / 'B' / 'spam.data'}", "checkpoints are kept")
    monkeypatch.chdir(base / "A")  # from the right folder it resumes
    _, flags, note = resume_run_dir(point)
    assert flags == ("--resume",), note


def test_a_sweep_point_whose_data_file_was_touched_is_refused(
        started_in_a, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, run, base = started_in_a
    data = base / "A" / "spam.data"
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 10**9))
    _refused(Point(0, "v", (), (), cfg, run.root), f"{data} was modified at")


def test_a_sweep_point_whose_gradient_log_is_gone_is_refused(started_in_a) -> None:
    cfg, run, _ = started_in_a
    assert complete_manifests(run.root)[-1].recorded
    shutil.rmtree(RunDir(run.root).gradients)
    _refused(Point(0, "v", (), (), cfg, run.root), "gradient log", "is gone")


def test_the_local_engine_fails_a_refused_point_without_running_it(
        started_in_a, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, run, base = started_in_a
    monkeypatch.chdir(base / "B")
    point = Point(0, "v", (), (), cfg, run.root)
    before = _contents(run.root)
    heard: dict[str, list] = {"started": [], "finished": []}

    class Listener:
        def started(self, p: Point) -> None:
            heard["started"].append(p.hash)

        def record(self, p: Point, record: dict) -> None:
            pass

        def finished(self, p: Point, result) -> None:
            heard["finished"].append((p.hash, result.status))

    results = LocalEngine(jobs=1, poll=0.01).run([point], Listener())
    result = results[point.hash]
    assert result.status == "failed" and "resume refused" in (result.message or "")
    assert "spam.data" in (result.message or "")
    assert heard == {"started": [point.hash], "finished": [(point.hash, "failed")]}
    written = read_result(run.root)
    assert written is not None and written.message == result.message
    assert "resume refused" in (RunDir(run.root).logs / "sweep_point.log").read_text()
    after = _contents(run.root)
    after.pop(str(RunDir(run.root).point_result.relative_to(run.root)))
    before.pop(str(RunDir(run.root).point_result.relative_to(run.root)), None)
    assert after == before


def test_on_ray_the_label_party_checks_the_data_not_the_driver(
        started_in_a, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's working directory and copy of the data are not the label party's node's:
    the driver leaves the check to the role (which refuses, failing the point), wiping nothing."""
    cfg, run, base = started_in_a
    monkeypatch.chdir(base / "B")
    before = _contents(run.root)
    _, flags, _ = resume_run_dir(Point(0, "v", (), (), cfg, run.root), data_here=False)
    assert flags == ("--resume",)
    sizes = {name: size for name, (size, _) in before.items()}
    assert {name: size for name, (size, _) in _contents(run.root).items()} == sizes
