"""Defenses against the attacks on the built-in default (same seed for every run): Li et al.'s
findings reproduce, and every defense runs from the config in a distributed run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attacker.analysis.analyze import analyze
from attacker.sidecar.store import GradientLog
from orchestration.reference import run_reference
from splitleak.artifacts.metrics import read_metrics
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import load_config, parse_config
from tests.conftest import small_config, write_config

pytestmark = pytest.mark.slow
ATTACKS = [("norm", {}), ("cosine_oracle", {})]


def _default_with(tmp_path: Path, chain: list[dict], name: str) -> tuple[RunDir, dict, dict]:
    """Run the default in-process (the same math as over gRPC) with `chain`; return the run,
    its cut-layer leak (attack -> raw stats) and the final evaluation."""
    data = load_config(None).model_dump(mode="json")
    data["defense"] = chain
    data["run"] = dict(data["run"], name=name, output_dir=str(tmp_path))
    cfg = parse_config(data)
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    summary = analyze(run.root, ATTACKS)
    leak = {e["attack"]: e["raw"] for e in summary["leak"]
            if e["scope"] == "run" and e["layer"] == "cut"}
    final = [r for r in read_metrics(run.metrics) if r["type"] == "eval"][-1]
    return run, leak, final


def _mean_diagnostic(run: RunDir, key: str) -> float:
    values = [r["defense.1"][key] for r in read_metrics(run.metrics)
              if r["type"] == "train" and key in r.get("defense.1", {})]
    return float(np.mean(values))


def test_li_et_al_findings_on_the_default(tmp_path: Path) -> None:
    plain_run, plain, plain_eval = _default_with(tmp_path, [], "plain")
    assert plain["norm"]["p95"] >= 0.9 and plain["cosine_oracle"]["p95"] >= 0.99

    marvell_run, marvell, marvell_eval = _default_with(tmp_path, [{"name": "marvell", "s": 4.0}],
                                                       "marvell")
    assert marvell_eval["test_auc"] > 0.65  # protection costs some utility, not all of it
    bound = _mean_diagnostic(marvell_run, "marvell.auc_bound")
    # The cosine oracle's anchor is the positive's clean gradient (Li et al. §3.3), so Marvell's
    # noise on the anchor no longer hides the leak (about 0.1 more than a noised anchor); it
    # stays under the Theorem-1 bound (about 0.72 here) all the same.
    assert marvell["norm"]["p95"] <= 0.7 and marvell["cosine_oracle"]["p95"] <= bound
    assert marvell["norm"]["mean"] <= bound and marvell["cosine_oracle"]["mean"] <= bound

    _, max_norm, _ = _default_with(tmp_path, [{"name": "max_norm"}], "max_norm")
    assert max_norm["norm"]["p95"] <= 0.65

    # iso with its t set so that its average noise power matches Marvell's: t·E‖g_max‖² = E[P].
    largest = [float(np.max(np.sum(b.tensors["cut_gradient"].astype(np.float64) ** 2, axis=1)))
               for b in GradientLog(plain_run.attacker / "gradients").batches(1)]
    power = _mean_diagnostic(marvell_run, "marvell.P")
    t = power / float(np.mean(largest))
    for attempt in range(2):  # iso's own noise changes training, so correct t once
        iso_run, iso, _ = _default_with(tmp_path, [{"name": "iso", "t": t}], f"iso{attempt}")
        achieved = _mean_diagnostic(iso_run, "iso.noise_power")
        t *= power / achieved
    assert 0.5 <= achieved / power <= 2.0, (achieved, power)
    assert iso["cosine_oracle"]["p95"] >= marvell["cosine_oracle"]["p95"] + 0.1
    print(f"\nno defense: norm p95 {plain['norm']['p95']:.3f}, cosine p95 "
          f"{plain['cosine_oracle']['p95']:.3f}, test AUC {plain_eval['test_auc']:.4f}\n"
          f"marvell s=4: norm p95 {marvell['norm']['p95']:.3f}, cosine p95 "
          f"{marvell['cosine_oracle']['p95']:.3f}, test AUC {marvell_eval['test_auc']:.4f}, "
          f"mean AUC bound {bound:.3f}\n"
          f"max_norm: norm p95 {max_norm['norm']['p95']:.3f}\n"
          f"iso (power ratio {achieved / power:.2f}): cosine p95 "
          f"{iso['cosine_oracle']['p95']:.3f}")


EVERY_DEFENSE = [
    {"name": "no_noise"},
    {"name": "max_norm"},
    {"name": "iso", "t": 0.5},
    {"name": "perp", "lower": 1.0, "upper": 2.0},
    {"name": "marvell", "s": 1.0, "dynamic": True, "target_error": 0.3},
    {"name": "dp_gaussian", "clip": 1.0, "noise_multiplier": 0.01},
    {"name": "laplace", "b": 1e-4},
    {"name": "sparsify", "kept_fraction": 0.5},
    {"name": "discrete_sgd", "bins": 12},
    {"name": "ppdl", "theta_u": 0.75},
]


def test_every_defense_runs_in_a_distributed_run_and_is_reported(tmp_path: Path) -> None:
    data = small_config(tmp_path, defense=EVERY_DEFENSE, training={"epochs": 2})
    path = write_config(tmp_path, data)
    result = subprocess.run([sys.executable, "-m", "orchestration", "run", str(path), "--no-progress"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    run = RunDir(next((tmp_path / "runs").iterdir()))
    outcome = json.loads(run.outcome.read_text())
    chain = outcome["defenses"]["1"]["chain"]
    assert chain == [d["name"] for d in EVERY_DEFENSE]
    epsilon = [d for d in outcome["defenses"]["1"]["parties"]["1"] if d["name"] == "dp_gaussian"]
    assert epsilon and epsilon[0]["epsilon"] > 0
    report = (run.report / "report.md").read_text()
    for defense in EVERY_DEFENSE:
        assert defense["name"] in report
    assert "kept_fraction" in report and "theta_u" in report
    train = [r for r in read_metrics(run.metrics) if r["type"] == "train"]
    assert all("marvell.p" in r["defense.1"] or r["defense.1"].get("marvell.passthrough")
               for r in train)
