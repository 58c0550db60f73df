"""The local engine end to end: concurrent points, the comparison, resume by hash, Ctrl-C that
stops every process of every running point and leaves the index consistent, failed points
recorded and retried only when asked."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import tomli_w
from rich.console import Console

from orchestration.sweep.index import SweepIndex, read_index
from orchestration.sweep.local import LocalEngine
from orchestration.sweep.points import resolve
from orchestration.sweep.runner import run_points
from orchestration.sweep.spec import parse_sweep
from splitleak.artifacts.metrics import read_metrics
from splitleak.artifacts.paths import POINT_RESULT_FILE as RESULT_FILE
from splitleak.artifacts.paths import RunDir
from splitleak.config import parse_config
from tests.conftest import scaled, small_config, write_config
from tests.runs import metrics_without_wall_clock

pytestmark = pytest.mark.slow


def _sweep_file(tmp_path: Path, base: dict, variants: list[dict], seeds: list[int]) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(tomli_w.dumps({
        "sweep": {"name": "t", "base": str(write_config(tmp_path, base)),
                  "output_dir": str(tmp_path / "sweeps"), "seeds": seeds},
        "variant": variants}))
    return path


def _sweep(path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestration", "sweep", str(path), "--no-progress",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _base(tmp_path: Path, **training) -> dict:
    return small_config(tmp_path, training={"epochs": 1, **training},
                        attacker={"attacks": ["norm", "cosine_majority"]})


MARVELL = {"name": "marvell", "set": {"defense": [{"name": "marvell", "s": 4.0}]}}


def test_sweep_runs_compares_and_resumes(tmp_path: Path) -> None:
    path = _sweep_file(tmp_path, _base(tmp_path), [{"name": "none"}, MARVELL], [0, 1])
    proc = _sweep(path, "--jobs", "2")
    out, _ = proc.communicate(timeout=scaled(400))
    assert proc.returncode == 0, out
    sweep_dir = tmp_path / "sweeps" / "t"
    rows = read_index(sweep_dir)
    assert [r["status"] for r in rows] == ["done"] * 4, rows
    assert [r["label"] for r in rows] == ["none, seed=0", "none, seed=1", "marvell, seed=0",
                                          "marvell, seed=1"]
    for row in rows:
        run = sweep_dir / row["run_dir"]
        assert (run / "report" / "summary.json").exists() and row["seconds"] > 0
        assert "hash " + row["run_dir"] in (run / "config.toml").read_text().splitlines()[0]
    report = (sweep_dir / "compare" / "report.md").read_text()
    assert "## norm" in report and "| marvell | 2 |" in report
    assert (sweep_dir / "compare" / "leak_vs_utility_cosine_majority.png").exists()
    assert (sweep_dir / "sweep.toml").read_text() == path.read_text()
    stamps = {r["run_dir"]: (sweep_dir / r["run_dir"] / RESULT_FILE).stat().st_mtime_ns for r in rows}

    again = _sweep(path, "--no-compare")
    out, _ = again.communicate(timeout=scaled(120))
    assert again.returncode == 0, out
    assert "0 run now, 4 skipped" in out.replace("\n", " ")
    assert stamps == {r: (sweep_dir / r / RESULT_FILE).stat().st_mtime_ns for r in stamps}

    trained = sweep_dir / rows[0]["run_dir"]  # e.g. stopped during its analysis: analysed again
    shutil.rmtree(trained / "report")
    metrics = (trained / "label_party" / "metrics.jsonl").read_bytes()
    again = _sweep(path, "--no-compare")
    out, _ = again.communicate(timeout=scaled(120))
    assert again.returncode == 0 and "1 run now, 3 skipped" in out.replace("\n", " "), out
    assert (trained / "report" / "summary.json").exists()
    assert (trained / "label_party" / "metrics.jsonl").read_bytes() == metrics  # not trained again
    assert "finished training: analysing it" in (trained / "logs" / "sweep_point.log").read_text()


def _processes_naming(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (cmdline.parent / "stat").read_text().split()[2]
        except OSError:
            continue
        if text in args and state != "Z":
            found.append(args)
    return found


def _wait_until(condition, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_ctrl_c_twice_stops_every_point_and_the_sweep_resumes_them(tmp_path: Path) -> None:
    base = _base(tmp_path, batch_size=8, epochs=30, eval_interval=0)
    quick = {"name": "quick", "set": {"training.epochs": 1, "training.batch_size": 64}}
    path = _sweep_file(tmp_path, base, [{"name": "long"}, MARVELL, quick], [0])
    sweep_dir = tmp_path / "sweeps" / "t"
    proc = _sweep(path, "--jobs", "2")

    def training(row: dict) -> bool:
        metrics = sweep_dir / row["run_dir"] / "label_party" / "metrics.jsonl"
        return metrics.exists() and any(r["type"] == "train" for r in read_metrics(metrics))

    def two_training() -> bool:
        if not (sweep_dir / "sweep.parquet").exists():
            return False
        running = [r for r in read_index(sweep_dir) if r["status"] == "running"]
        return len(running) == 2 and all(map(training, running))

    _wait_until(two_training, scaled(300), "two points to train")
    assert _processes_naming(str(sweep_dir))  # the points' workers and parties are running
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # a second Ctrl-C (or `timeout` passing one on) while stopping
    out, _ = proc.communicate(timeout=scaled(60))
    assert proc.returncode == 130, out
    assert "Run the same command again to resume" in out
    rows = read_index(sweep_dir)
    assert [r["status"] for r in rows] == ["interrupted", "interrupted", "pending"], rows
    time.sleep(0.5)
    assert _processes_naming(str(sweep_dir)) == []  # workers and every party of every point
    firsts = {}
    for row in rows[:2]:
        run = sweep_dir / row["run_dir"]
        assert json.loads((run / "label_party" / "outcome.json").read_text())["status"] == "interrupted"
        firsts[row["run_dir"]] = (run / "logs" / "label_party.log").read_text().splitlines()[0]

    again = _sweep(path, "--jobs", "2", "--no-compare")
    out, _ = again.communicate(timeout=scaled(600))
    assert again.returncode == 0, out
    assert "3 run now, 0 skipped" in out.replace("\n", " ")
    assert [r["status"] for r in read_index(sweep_dir)] == ["done"] * 3
    for row in rows[:2]:  # resumed from the checkpoint Ctrl-C made, the first attempt's logs kept
        logs = sweep_dir / row["run_dir"] / "logs"
        assert "resuming the point's earlier attempt at step" in (logs / "sweep_point.log").read_text()
        assert firsts[row["run_dir"]] in (logs / "label_party.log").read_text()
    reference = _sweep(path, "--engine", "inprocess", "--jobs", "1", "--no-compare",
                       "--output-dir", str(tmp_path / "reference"))
    out, _ = reference.communicate(timeout=scaled(600))
    assert reference.returncode == 0, out
    for row in rows:  # the numbers of points run without a stop
        _same_numbers(sweep_dir / row["run_dir"], tmp_path / "reference" / "t" / row["run_dir"])

def _same_numbers(a: Path, b: Path) -> None:
    """metrics.jsonl (wall clock aside), the leak table and the summary's leak entries equal."""
    assert metrics_without_wall_clock(RunDir(a)) == metrics_without_wall_clock(RunDir(b))
    leak = "attacker/leak.parquet"
    assert pq.read_table(a / leak).to_pylist() == pq.read_table(b / leak).to_pylist()
    summary = "report/summary.json"
    assert json.loads((a / summary).read_text())["leak"] == json.loads((b / summary).read_text())["leak"]


def test_a_failed_point_is_recorded_and_retried_only_when_asked(tmp_path: Path) -> None:
    broken = small_config(tmp_path, dataset={"name": "breast_cancer", "params": {"rows": 5}})
    sweep = parse_sweep({"sweep": {"name": "f", "seeds": [0]}})
    (point,) = resolve(sweep, parse_config(broken), tmp_path / "f")  # no check: fails when run
    index = SweepIndex(tmp_path / "f", [point], "local")
    console = Console(quiet=True)
    outcome = run_points([point], index, LocalEngine(jobs=1), console=console, show_progress=False)
    (row,) = read_index(tmp_path / "f")
    assert row["status"] == "failed" and outcome.counts == {"failed": 1}
    assert "label party exited with code 2 before serving" in row["message"]
    assert "dataset.params" in row["message"]
    first = row["updated"]

    skipped = run_points([point], SweepIndex(tmp_path / "f", [point], "local"), LocalEngine(jobs=1),
                         console=console, show_progress=False)
    assert skipped.skipped == 1 and not skipped.results
    time.sleep(1.1)  # the index stamps seconds
    retried = run_points([point], SweepIndex(tmp_path / "f", [point], "local"), LocalEngine(jobs=1),
                         retry_failed=True, console=console, show_progress=False)
    assert retried.skipped == 0 and retried.results[point.hash].status == "failed"
    log = (point.run_dir / "logs" / "sweep_point.log").read_text()
    assert "left no complete checkpoint; the point starts again from step 0" in log
    assert read_index(tmp_path / "f")[0]["updated"] != first
