"""The other benchmarks' plug-ins end to end: the clustering attack on the built-in default, each
new defense against the attacks it targets on digits, and every new defense in a distributed
run (real processes, gRPC) with 1 and 3 passive parties.

The full table (two strengths per defense, utility and every attack that applies): the sweeps
examples/defenses/plugins_default.toml and plugins_digits.toml with `splitleak compare`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w

from attacker.analysis.analyze import analyze, metric_stats
from attacker.sidecar.store import GradientLog
from orchestration.reference import run_reference
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import load_config, parse_config
from tests.conftest import scaled, small_config
from tests.runs import distributed_and_reference

pytestmark = pytest.mark.slow

MULTICLASS = [("direct_label", {}), ("clustering", {}), ("batch_label_counts", {})]


def train_and_attack(data: dict[str, Any], attacks: list) -> tuple[dict, dict, dict]:
    """In process (the same math as over gRPC): (final eval, attack -> party 1's cut-layer
    stats of its metric, objective summary)."""
    cfg = parse_config(data)
    run = create_run_dir(cfg)
    outcome = run_reference(cfg, run)
    summary = analyze(run.root, attacks)
    leak = {e["attack"]: metric_stats(e) for e in summary["leak"]
            if e["scope"] == "run" and e["layer"] == "cut" and e["party_id"] == 1}
    evals = [json.loads(line) for line in run.metrics.read_text().splitlines() if '"eval"' in line]
    return evals[-1], leak, outcome["objective"]


def test_clustering_recovers_the_labels_on_the_default(tmp_path: Path) -> None:
    data = load_config(None).model_dump(mode="json")
    data["run"] = dict(data["run"], output_dir=str(tmp_path))
    data["dataset"]["params"] = dict(data["dataset"]["params"], rows=30000)
    data["training"] = dict(data["training"], epochs=1)
    final, leak, _ = train_and_attack(data, [("clustering", {}), ("clustering", {"scope": "epoch"})])
    print(f"\ntest AUC {final['test_auc']:.3f}; clustering {leak}")
    assert leak["clustering"]["mean"] >= 0.9 and leak["clustering"]["p95"] >= 0.9
    assert leak["clustering(scope=epoch)"]["mean"] >= 0.9


def digits(tmp_path: Path, name: str, **sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "run": {"name": name, "seed": 0, "output_dir": str(tmp_path / "runs")},
        "dataset": {"name": "digits", "test_fraction": 0.25},
        "features": {"passive": [[0, 4], [4, 8]]},
        "model": {"kind": "mlp", "layers": [64], "cut_layer": 1, "top": "none", "aggregation": "sum"},
        "training": {"batch_size": 64, "epochs": 10, "optimizer": {"name": "adam", "lr": 0.003}},
        "topology": {"passive_parties": 2},
    }
    return {**data, **sections}


DEFENDED = {
    "grad_perturb": {"defense": [{"name": "grad_perturb", "epsilon": 10.0}]},
    "mid": {"objective": {"name": "mid", "lambda": 0.1}},
    "cae": {"objective": {"name": "cae", "lambda": 0.5}},
    "dcor": {"objective": {"name": "dcor", "alpha": 1.0}},
    "pe_loss": {"objective": {"name": "pe_loss", "alpha": 1.0}},
}


def test_each_defense_lowers_the_multiclass_leak_on_digits(tmp_path: Path) -> None:
    plain_eval, plain, _ = train_and_attack(digits(tmp_path, "plain"), MULTICLASS)
    print(f"\nno defense: accuracy {plain_eval['test_accuracy']:.3f} {plain}")
    assert plain["direct_label"]["mean"] == 1.0 and plain["clustering"]["mean"] >= 0.9
    assert plain["batch_label_counts"]["mean"] < 0.2  # counts within 20 % of the batch
    for name, sections in DEFENDED.items():
        final, leak, summary = train_and_attack(digits(tmp_path, name, **sections), MULTICLASS)
        print(f"{name}: accuracy {final['test_accuracy']:.3f} {leak}")
        assert leak["direct_label"]["mean"] < 0.5, name
        assert leak["clustering"]["mean"] < plain["clustering"]["mean"] - 0.2, name
        assert final["test_accuracy"] >= plain_eval["test_accuracy"] - 0.06, name
    assert summary["name"] == "pe_loss" and summary["alpha"] == 1.0


DISTRIBUTED = {
    "grad_perturb": dict(dataset={"name": "digits"}, training={"loss": "ce"},
                         defense=[{"name": "grad_perturb", "epsilon": 2.0}]),
    "mid": dict(dataset={"name": "breast_cancer"}, objective={"name": "mid", "lambda": 0.01}),
    "dcor": dict(dataset={"name": "digits"}, objective={"name": "dcor", "alpha": 0.5}),
    "pe_loss": dict(dataset={"name": "breast_cancer"},
                    objective={"name": "pe_loss", "alpha": 0.5, "distance": "angular"}),
    "cae": dict(dataset={"name": "digits"}, objective={"name": "cae", "lambda": 1.0, "epochs": 2}),
}


@pytest.mark.parametrize("parties", [1, 3])
@pytest.mark.parametrize("name", sorted(DISTRIBUTED))
def test_distributed_run(tmp_path: Path, name: str, parties: int) -> None:
    case = DISTRIBUTED[name]
    columns = 30 if case["dataset"]["name"] == "breast_cancer" else 8  # digits: 8 pixel columns
    cuts = [round(columns * i / parties) for i in range(parties + 1)]
    data = {
        "run": {"name": f"{name}_{parties}", "seed": 0},
        "dataset": {**case["dataset"], "test_fraction": 0.25},
        "features": {"passive": [[a, b] for a, b in zip(cuts, cuts[1:], strict=False)]},
        "model": {"kind": "mlp", "layers": [16, 8], "cut_layer": 1},
        "training": {"batch_size": 64, "epochs": 1, "max_steps": 4, "eval_interval": 2,
                     "optimizer": {"name": "adam", "lr": 0.001}, **case.get("training", {})},
        "topology": {"passive_parties": parties, "step_deadline_s": scaled(60),
                     "join_deadline_s": scaled(120)},
        "objective": case.get("objective", {"name": "cross_entropy"}),
        "defense": case.get("defense", []),
        "attacker": {"attacks": ["clustering", "norm"] if columns == 30 else ["clustering"]},
    }
    config = tmp_path / "exp.toml"
    config.write_text(tomli_w.dumps(data))
    result = subprocess.run([sys.executable, "-m", "orchestration", "run", "--no-progress",
                             "--output-dir", str(tmp_path / "runs"), str(config)],
                            capture_output=True, text=True, timeout=scaled(300))
    assert result.returncode == 0, result.stdout + result.stderr
    run = RunDir(next((tmp_path / "runs").iterdir()))
    outcome = json.loads(run.outcome.read_text())
    assert outcome["status"] == "ok" and outcome["train_steps"] == 4
    assert outcome["objective"]["name"] == data["objective"]["name"]
    if name == "grad_perturb":
        chain = outcome["defenses"]["1"]["parties"]["1"][0]
        assert chain["name"] == "grad_perturb" and chain["laplace_scale"] == 1.0
        records = [json.loads(line) for line in run.metrics.read_text().splitlines()]
        noise = [r["defense.1"]["grad_perturb.noise_norm_mean"] for r in records
                 if r.get("type") == "train"]
        assert len(noise) == 4 and all(v > 0 for v in noise)
    summary = json.loads((run.report / "summary.json").read_text())
    attacks = {e["attack"] for e in summary["leak"] if e["scope"] == "run"}
    assert "clustering" in attacks
    report = (run.report / "report.md").read_text()
    assert f"`{data['objective']['name']}`" in report


def test_reference_records_the_activations_the_tap_records(tmp_path: Path) -> None:
    """attacker.record_activation: the in-process reference logs what the distributed tap logs."""
    data = small_config(tmp_path, training={"batch_size": 32, "epochs": 1, "max_steps": 3},
                        attacker={"record_activation": True})
    distributed, reference = distributed_and_reference(tmp_path, data)
    logs = [list(GradientLog(r.attacker / "gradients").batches(1)) for r in (distributed, reference)]
    assert [b.step for b in logs[0]] == [b.step for b in logs[1]] == [0, 1, 2]
    for ours, theirs in zip(*logs, strict=True):
        assert np.array_equal(ours.sample_ids, theirs.sample_ids)
        np.testing.assert_allclose(ours.tensors["activation"], theirs.tensors["activation"],
                                   rtol=1e-5, atol=1e-6)
    summary = analyze(reference.root, [("clustering", {})])
    assert {e["layer"] for e in summary["leak"]} == {"cut", "first", "activation"}
