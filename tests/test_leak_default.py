"""`splitleak run` with no argument, end to end over gRPC: the default without a defense leaks
like Li et al. observed (p95 norm leak AUC >= 0.9, cosine >= 0.99), the Marvell run is shown
beside it, and `attacker analyze` reproduces the numbers `splitleak run` reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from splitleak.artifacts.paths import RunDir

pytestmark = pytest.mark.slow


def _run_stats(summary: dict) -> dict[tuple[str, str], dict]:
    return {(e["layer"], e["attack"]): e for e in summary["leak"] if e["scope"] == "run"}


def test_default_run_leaks_like_li_et_al(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "orchestration", "run", "--no-progress",
                             "--output-dir", str(tmp_path)], capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    run = RunDir(next(tmp_path.glob("default-2*")))  # the run without a defense
    marvell = RunDir(next(tmp_path.glob("default-marvell-*")))
    assert (marvell.report / "report.md").exists()
    assert "no defense" in result.stdout and "marvell s=4" in result.stdout  # side by side
    summary = json.loads((run.report / "summary.json").read_text())
    stats = _run_stats(summary)
    norm, cosine = stats[("cut", "norm")], stats[("cut", "cosine_oracle")]
    assert norm["raw"]["p95"] >= 0.9 and cosine["raw"]["p95"] >= 0.99
    assert norm["skipped"] == 0  # >= 50 positives in every batch: no single-class batch
    assert ("first", "norm") in stats  # the first layer is recorded and analysed too
    final = json.loads(run.summary.read_text())["final_eval"]
    assert final["test_auc"] > 0.7
    for name in ("report.md", "summary.json"):
        assert (run.report / name).exists()
    assert "norm" in result.stdout and "cosine_oracle" in result.stdout
    # one side-by-side table instead of each run's own leak table: "label leakage" is the
    # per-run table's title; the comparison has both layers, changes against the first column
    assert "label leakage" not in result.stdout and "side by side" in result.stdout
    assert "cut layer" in result.stdout and "first layer" in result.stdout
    norm_row = next(line for line in result.stdout.splitlines() if line.split()[:1] == ["norm"])
    assert "(-0." in norm_row  # Marvell lowers the norm leak

    again = subprocess.run([sys.executable, "-m", "attacker", "analyze", str(run.root)],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    reanalysed = _run_stats(json.loads((run.report / "summary.json").read_text()))
    assert reanalysed.keys() == stats.keys()
    for key, entry in stats.items():
        assert reanalysed[key]["raw"] == entry["raw"], key
