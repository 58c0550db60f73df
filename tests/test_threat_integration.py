"""The threat model end to end: a distributed run with a malicious, a curious and a colluding
party under Marvell, analysed and reported; and Fu et al.'s active attack beating the passive one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attacker.analysis.analyze import analyze
from orchestration.reference import run_reference
from splitleak.anchors import read_clean_anchors
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import parse_config
from tests.conftest import scaled, small_config, write_config

pytestmark = pytest.mark.slow


def test_distributed_run_with_a_threat_model_is_analysed_and_reported(tmp_path: Path) -> None:
    threat = {"draws": 3, "collusion": [[1, 2]],
              "parties": {"1": {"optimizer": "malicious", "labelled_per_class": 4},
                          "2": {"curious": True}}}
    attacks = ["norm", "cosine_oracle", {"name": "hint_distance", "k": 3},
               {"name": "model_completion", "labelled_per_class": 4, "steps": 60}]
    path = write_config(tmp_path, small_config(
        tmp_path, threat=threat, defense=[{"name": "marvell", "s": 4.0}],
        attacker={"attacks": attacks},
        training={"optimizers": {"1": {"name": "sgd", "lr": 0.05, "momentum": 0.9}}}))
    result = subprocess.run([sys.executable, "-m", "orchestration.cli", "run", str(path),
                             "--no-progress"], capture_output=True, text=True, timeout=scaled(600),
                            env={**os.environ, "COLUMNS": "160"})
    assert result.returncode == 0, result.stdout + result.stderr
    run = RunDir(next((tmp_path / "runs").iterdir()))
    assert "malicious optimizer" in (run.logs / "passive_party_1.log").read_text()
    anchors, warning = read_clean_anchors(run.clean_anchors)
    assert warning is None and {k for k, _ in anchors} == {1, 2}  # both tapped parties
    summary = json.loads((run.report / "summary.json").read_text())
    assert summary["draws"] == 3 and summary["threat"]["parties"]["1"]["optimizer"] == "malicious"
    runs = [e for e in summary["leak"] if e["scope"] == "run"]
    who = {("+".join(map(str, e["parties"])), e["layer"], e["attack"].split("(")[0]) for e in runs}
    for parties in ("1", "2", "1+2"):  # each party, and the colluding pair on joined gradients
        assert (parties, "cut", "cosine_oracle") in who and (parties, "bottom", "model_completion") in who
    oracle = next(e for e in runs if e["parties"] == [1] and e["attack"] == "cosine_oracle"
                  and e["layer"] == "cut")
    assert oracle["draws"] == 3 and oracle["threat"].startswith("curious, malicious optimizer")
    assert set(oracle["spread"]["flipped"]["p95"]) == {"std", "min", "max"}
    assert not any("no clean anchor" in w for w in summary["warnings"])
    completion = next(e for e in runs if e["parties"] == [1, 2] and e["layer"] == "bottom")
    assert completion["completion"]["labelled"] == 4 * 2 and "random_bottom" in completion["completion"][
        "baselines"]
    report = (run.report / "report.md").read_text()
    for part in ("## Threat model", "## Model completion",
                 "| 1 | yes | malicious optimizer (γ=1, clamp [1, 5]) |",
                 "Colluding groups (analysed together): 1+2", "### Party 1+2, cut layer"):
        assert part in report
    lines = result.stdout.splitlines()
    assert "model completion" in result.stdout and "cut layer, party 1 (malicious)" in result.stdout
    assert any(line.split()[:1] == ["cosine_oracle"] and "clean pos." in line for line in lines)


def _digits_run(tmp_path: Path, optimizer: str, seed: int) -> RunDir:
    cfg = parse_config(small_config(
        tmp_path, run={"name": f"digits-{optimizer}-{seed}", "seed": seed},
        dataset={"name": "digits", "test_fraction": 0.25}, features={"passive": [[0, 4], [4, 8]]},
        model={"kind": "mlp", "layers": [16, 32], "cut_layer": 1},
        training={"batch_size": 32, "epochs": 10, "eval_interval": 0,
                  "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9}},
        threat={"parties": {"1": {"optimizer": optimizer, "labelled_per_class": 4}}}))
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    return run


def test_malicious_party_bottom_carries_more_label_information(tmp_path: Path) -> None:
    # Fu et al.: the malicious optimizer makes the top model lean on the malicious party, whose
    # bottom model then completes to a better label classifier than an honest party's. Measured
    # with the bottom frozen (what training put into it; fine-tuning on these 8x8 images relearns
    # most of it from the features) and the seeds paired: over seeds 0, 1, 2 the malicious
    # party's completion was 2 to 4 points higher on every seed (train and test rows).
    gain = []
    for seed in (0, 1):
        accuracy = {}
        for optimizer in ("honest", "malicious"):
            run = _digits_run(tmp_path, optimizer, seed)
            params = {"labelled_per_class": 4, "steps": 1500, "fine_tune_bottom": False,
                      "ema_decay": 0.99, "baselines": False}
            summary = analyze(run.root, [("model_completion", params)])
            entry = next(e for e in summary["leak"] if e["layer"] == "bottom")
            accuracy[optimizer] = entry["pooled"]["accuracy"]
        gain.append(accuracy["malicious"] - accuracy["honest"])
    assert min(gain) > 0 and float(np.mean(gain)) > 0.015, gain
