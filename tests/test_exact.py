"""EXACT and the white-box snapshots: the vectorised enumeration against brute force, the cap,
the threat model's checks, the artifact, and that nothing of it travels over the protocol."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attacker.analysis.analyze import AnalysisInputError, analyze
from attacker.attacks import AttackRefused, build_attack
from attacker.attacks.exact.exact import Candidates, candidate_gradients, reconstruct
from attacker.sidecar.store import GradientLog
from splitleak.artifacts.paths import RunDir
from splitleak.config import ConfigError, ModelConfig, parse_config
from splitleak.models import InputSpec, build_top
from splitleak.threat import ThreatConfig
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.validation import check_core, validate
from splitleak.white_box import (
    OwnColumns,
    SnapshotWriter,
    own_columns,
    read_snapshot,
    snapshot_files,
    snapshot_path,
)
from tests.conftest import scaled, small_config, write_config

CARDS = (3, 4)


def _tiny_top(kind: str = "mlp") -> torch.nn.Module:
    cfg = ModelConfig(kind=kind, layers=[6, 5], cut_layer=1, embedding_dim=2)
    return build_top(cfg, [(6,)], InputSpec(1, (2, *CARDS)), outputs=1, seed=4)


def _label_party_gradient(top: torch.nn.Module, h: torch.Tensor, numeric: torch.Tensor,
                          cats: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """What the label party returns: d(mean BCE over the batch)/dh, plain autograd."""
    h = h.clone().requires_grad_(True)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(top([h], numeric, cats)[:, 0], y.float())
    return torch.autograd.grad(loss, h)[0]


@pytest.mark.parametrize("kind", ["mlp", "wide_deep"])
def test_exact_equals_brute_force_on_a_tiny_model(kind: str) -> None:
    g = torch.Generator().manual_seed(0)
    top = _tiny_top(kind)
    for p in top.parameters():  # trained-looking weights: embeddings far enough apart
        p.data.normal_(0, 0.5, generator=g)
    batch = 7
    h, numeric = torch.randn(batch, 6, generator=g), torch.randn(batch, 1, generator=g)
    cats = torch.stack([torch.randint(0, 2, (batch,), generator=g),
                        torch.randint(0, CARDS[0], (batch,), generator=g),
                        torch.randint(0, CARDS[1], (batch,), generator=g)], dim=1)
    y = torch.randint(0, 2, (batch,), generator=g)
    received = _label_party_gradient(top, h, numeric, cats, y)
    candidates = Candidates.enumerate(list(CARDS), (1, 2), labels=2)
    assert candidates.count == 2 * 3 * 4
    # Brute force: one plain backward per example, label and value combination.
    brute = torch.empty(batch, 2, 12, 6)
    for i, label, (f, (a, b)) in itertools.product(range(batch), range(2),
                                                    enumerate(itertools.product(*map(range, CARDS)))):
        c = cats.clone()
        c[i, 1], c[i, 2] = a, b
        yy = y.clone()
        yy[i] = label
        brute[i, label, f] = _label_party_gradient(top, h, numeric, c, yy)[i]
    fast = candidate_gradients(top, h, numeric, cats, candidates, batch)
    torch.testing.assert_close(fast, brute, rtol=1e-5, atol=1e-9)
    distance = (brute - received[:, None, None]).square().sum(-1).reshape(batch, -1)
    best = distance.argmin(1)
    found = reconstruct(top, h, received, numeric, cats, candidates, chunk_candidates=30)
    labels, codes = found.labels, found.codes
    assert found.ties == {}  # trained-looking weights: no two candidates at the same distance
    np.testing.assert_array_equal(labels, (best // 12).numpy())
    np.testing.assert_array_equal(codes, candidates.codes[best % 12].numpy())
    np.testing.assert_array_equal(labels, y.numpy())  # no defense: the truth is the nearest
    np.testing.assert_array_equal(codes, cats[:, 1:].numpy())


def _exact_config(tmp_path: Path, **overrides: object) -> dict:
    data = small_config(
        tmp_path, dataset={"name": "synthetic_ctr", "params": {"rows": 600, "vocab_size": 4}},
        features={"passive": [[0, 34]], "label_party": [34, 36]},
        topology={"passive_parties": 1, "tls": False},
        training={"batch_size": 100, "epochs": 1, "eval_interval": 0,
                  "optimizer": {"name": "adagrad", "lr": 0.01}},
        attacker={"record_activation": True, "attacks": ["exact"]},
        threat={"parties": {"1": {"white_box": True}}, "white_box": {"every": 2}})
    data.update(overrides)
    return data


def test_the_threat_model_states_what_exact_needs(tmp_path: Path) -> None:
    bad = _exact_config(tmp_path, attacker={"record_activation": False})
    with pytest.raises(ConfigError, match="record_activation = true"):
        validate(parse_config(bad))
    with pytest.raises(ValueError, match="white_box = true needs curious = true"):
        ThreatConfig.model_validate({"parties": {"1": {"white_box": True, "curious": False}}})
    unknown = _exact_config(tmp_path)
    unknown["threat"]["white_box"] = {"private_features": ["C1"]}
    with pytest.raises(ConfigError, match=r"names \['C1'\]; allowed: .*C22, C23"):
        check_core(parse_config(unknown))
    cfg = parse_config(_exact_config(tmp_path))
    own = own_columns(cfg, check_core(cfg))
    assert own.private_names == ["C22", "C23"] and own.private_cardinalities == [4, 4]
    # `splitleak validate` refuses with exit 2 and the sentence
    path = write_config(tmp_path, unknown)
    done = subprocess.run([sys.executable, "-m", "orchestration", "validate", str(path)],
                          capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 2 and "private_features" in done.stderr + done.stdout


def test_snapshots_are_bounded_atomic_and_cut_back_on_resume(tmp_path: Path) -> None:
    threat = ThreatConfig.model_validate({"parties": {"1": {"white_box": True}},
                                          "white_box": {"every": 2, "max_snapshots": 3}})
    writer = SnapshotWriter(tmp_path / "wb", threat)
    top = _tiny_top()
    for step in range(10):
        writer.record(0, step, top)
    assert list(snapshot_files(tmp_path / "wb")) == [0, 2, 4]  # every 2nd, at most 3
    step, state = read_snapshot(snapshot_files(tmp_path / "wb")[2])
    assert step == 2 and all(torch.equal(state[k], v) for k, v in top.state_dict().items())
    writer.keep_before(2)
    assert list(snapshot_files(tmp_path / "wb")) == [0]
    assert not list((tmp_path / "wb").glob("*.tmp*"))


def test_the_cap_refuses_naming_the_sizes() -> None:
    attack = build_attack("exact", {"max_combinations": 30})
    own = OwnColumns((), ("a", "b"), (4, 5), (0, 1))
    with pytest.raises(AttackRefused, match=r"4 \(a\) x 5 \(b\) x 2 labels = 40 .* max_combinations = 30"):
        attack.check_size(own, Candidates.enumerate([4, 5], (0, 1), 2))


def test_validate_refuses_an_enumeration_above_the_cap_before_training(tmp_path: Path) -> None:
    """The cap was only checked by the analysis, after the whole run had trained."""
    data = _exact_config(tmp_path)
    data["attacker"]["attacks"] = [{"name": "exact", "max_combinations": 10}]
    with pytest.raises(ConfigError, match=r"4 \(C22\) x 4 \(C23\) x 2 labels = 32 .* max_combinations = 10"):
        validate(parse_config(data))
    data["attacker"]["attacks"] = [{"name": "exact", "max_combinations": 32}]
    validate(parse_config(data))


@pytest.mark.slow
def test_exact_over_real_processes_and_nothing_white_box_crosses_the_wire(tmp_path: Path) -> None:
    """Two real runs (separate processes, gRPC) that differ only in the white-box declaration:
    the passive party receives the same messages, byte for byte in count and gradient for
    gradient; only the white-box run has snapshots, and EXACT reads them offline."""
    runs = {}
    for name, white in (("white", True), ("plain", False)):
        data = _exact_config(tmp_path / name)
        data["threat"] = {"parties": {"1": {"white_box": white}}, "white_box": {"every": 2}}
        data["attacker"] = {"record_activation": True, "attacks": ["norm"]}
        path = write_config(tmp_path, data, f"{name}.toml")
        done = subprocess.run([sys.executable, "-m", "orchestration", "run", "--no-progress", str(path)],
                              capture_output=True, text=True, timeout=scaled(300))
        assert done.returncode == 0, done.stdout + done.stderr
        runs[name] = RunDir(next((tmp_path / name / "runs").iterdir()))
    white, plain = runs["white"], runs["plain"]
    # What the label party may send a passive party: batches, cut gradients, checkpoints.
    assert {f.name for f in pb.LabelPartyMessage.DESCRIPTOR.fields} == {
        "next_batch", "done", "cut_gradient", "gradient_step", "gradient_epoch", "checkpoint"}
    sent = [json.loads(r.outcome.read_text())["bytes_sent"] for r in (white, plain)]
    assert sent[0] == sent[1]  # not one byte more for the white-box run
    received = [list(GradientLog(r.attacker / "gradients").batches(1)) for r in (white, plain)]
    assert len(received[0]) == len(received[1]) > 0
    for a, b in zip(*received, strict=True):
        np.testing.assert_array_equal(a.tensors["cut_gradient"], b.tensors["cut_gradient"])
    assert snapshot_files(white.white_box) and not plain.white_box.exists()
    summary = analyze(white.root, [("exact", {})])
    entry = next(e for e in summary["leak"] if e["attack"].startswith("exact"))
    assert entry["exact"]["label_f1"] == 1.0 and entry["exact"]["batches"] >= 2
    with pytest.raises(AnalysisInputError, match="max_combinations = 5"):
        analyze(white.root, [("exact", {"max_combinations": 5})])


def _write_adult(path: Path, rows: int, seed: int = 0) -> None:
    """An Adult-format file (UCI adult.data) whose income depends on its fields."""
    rng = np.random.default_rng(seed)
    values = {"workclass": ["Private", "State-gov", "Self-emp-inc"],
              "education": ["Bachelors", "HS-grad", "Masters", "11th"],
              "marital": ["Never-married", "Married-civ-spouse", "Divorced"],
              "occupation": ["Adm-clerical", "Exec-managerial", "Sales"],
              "relationship": ["Husband", "Not-in-family", "Own-child", "Wife"],
              "race": ["White", "Black", "Asian-Pac-Islander"], "sex": ["Male", "Female"]}
    pick = {k: rng.integers(0, len(v), rows) for k, v in values.items()}
    age, hours = rng.integers(18, 80, rows), rng.integers(10, 70, rows)
    logit = 0.05 * (age - 45) + 1.5 * (pick["marital"] == 1) + 0.8 * (pick["education"] == 2) \
        - 1.0 * (pick["relationship"] == 2) + 0.03 * (hours - 40) + rng.normal(0, 0.5, rows)
    lines = []
    for i in range(rows):
        v = {k: values[k][pick[k][i]] for k in values}
        lines.append(f"{age[i]}, {v['workclass']}, {100000 + i}, {v['education']}, 10, {v['marital']}, "
                     f"{v['occupation']}, {v['relationship']}, {v['race']}, {v['sex']}, 0, 0, {hours[i]}, "
                     f"United-States, {'>50K' if logit[i] > 0.5 else '<=50K'}")
    path.write_text("\n".join(lines) + "\n")


def _adult_run(tmp_path: Path, example: str, rows: int = 4000) -> tuple[float, dict]:
    """The example on a test-written Adult-format file (in process): final test AUC, EXACT."""
    from orchestration.reference import run_reference
    from splitleak.artifacts.metrics import read_metrics
    from splitleak.artifacts.rundir import create_run_dir
    from splitleak.config import load_config

    data_file = tmp_path / "adult.data"
    if not data_file.exists():
        _write_adult(data_file, rows)
    data = load_config(Path(__file__).parent.parent / "examples" / "exact" / example).model_dump(
        mode="json", exclude_none=True)
    data["dataset"]["params"]["path"] = str(data_file)
    data["run"]["output_dir"] = str(tmp_path / "runs")
    data["threat"]["white_box"]["every"] = 4  # 7 of the 26 steps: enough rows, quick
    cfg = parse_config(data)
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    auc = [r["test_auc"] for r in read_metrics(run.metrics) if r["type"] == "eval"][-1]
    entry = next(e for e in analyze(run.root, [("exact", {})])["leak"] if e["attack"].startswith("exact"))
    return auc, entry["exact"]


@pytest.mark.slow
def test_exact_on_the_adult_examples_with_and_without_dp(tmp_path: Path) -> None:
    auc, plain = _adult_run(tmp_path, "adult.toml")
    assert set(plain["feature_f1"]) == {"marital-status", "relationship", "race", "sex"}
    assert plain["label_f1"] >= 0.99 and min(plain["feature_f1"].values()) >= 0.95
    dp_auc, dp = _adult_run(tmp_path, "adult_dp.toml")
    assert dp["label_f1"] <= 0.9 and max(dp["feature_f1"].values()) <= 0.6
    assert dp_auc >= auc - 0.01


def test_attacker_bench_prints_candidate_gradients_per_second() -> None:
    done = subprocess.run([sys.executable, "-m", "attacker", "bench", "--exact", "--rows", "64",
                           "--vocab", "3", "--dim", "8", "--batch-size", "32"],
                          capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout[done.stdout.index("{"):])
    assert figures["candidates"] == 64 * 3 * 3 * 2 and figures["per_cpu_second"] > 0
    assert "candidate gradients per second per core" in done.stdout


@pytest.mark.slow
def test_a_resumed_white_box_run_writes_the_same_snapshots(tmp_path: Path) -> None:
    """Interrupted after a checkpoint and resumed: the snapshots of the redone steps are written
    anew and every snapshot equals an uninterrupted run's, as does the label export."""
    import asyncio

    from splitleak.artifacts.rundir import write_config as write_run_config
    from tests.live import whole_run

    data = _exact_config(tmp_path)
    data["training"] = {**data["training"], "batch_size": 40, "checkpoint_every": 3}
    data["topology"] = {**data["topology"], "step_deadline_s": scaled(20), "join_deadline_s": scaled(30)}
    data["threat"]["white_box"] = {"every": 1}
    cfg = parse_config(data)
    runs = {}
    for name in ("straight", "interrupted"):
        run = RunDir(tmp_path / name)
        run.root.mkdir()
        write_run_config(cfg, run)
        runs[name] = run
    outcome, _ = asyncio.run(whole_run(cfg, runs["straight"].root))
    assert outcome["status"] == "ok"
    outcome, _ = asyncio.run(whole_run(cfg, runs["interrupted"].root, interrupt_at=7))
    assert outcome["status"] == "interrupted"
    stray = snapshot_path(runs["interrupted"].white_box, 11)  # a step after the checkpoint, torn
    stray.write_bytes(b"torn")  # (the resumed run drops and rewrites it)
    outcome, _ = asyncio.run(whole_run(cfg, runs["interrupted"].root, resume=True))
    assert outcome["status"] == "ok" and outcome["resumed_from"] > 0
    straight, resumed = (snapshot_files(r.white_box) for r in runs.values())
    assert list(straight) == list(resumed) == list(range(12))  # 480 train rows / 40
    for step in straight:
        assert straight[step].read_bytes() == resumed[step].read_bytes(), step
    assert runs["straight"].labels.read_bytes() == runs["interrupted"].labels.read_bytes()


def test_the_report_shows_exact_and_no_empty_leak_table() -> None:
    from rich.console import Console

    from attacker.attacks.exact.report import exact_md
    from attacker.report.terminal import print_leak_table

    entry = {"party_id": 1, "parties": [1], "layer": "bottom", "scope": "run", "attack": "exact",
             "side_knowledge": "white box", "pooled": {"accuracy": 0.9, "rows": 10},
             "exact": {"label_f1": 0.875, "feature_f1": {"C4": 0.5, "C9": 0.25},
                       "candidates_per_example": 1024, "batches": 3}}
    summary = {"leak": [entry], "seed": 0, "draws": 5}
    lines = "\n".join(exact_md(summary))
    assert "## EXACT" in lines and "| 1 | 0.875 | C4 0.500, C9 0.250 | 0.900 | 1,024 | 10 | 3 |" in lines
    console = Console(record=True, width=200)
    print_leak_table(console, summary)
    text = console.export_text()
    assert "EXACT (white box)" in text and "label leakage" not in text
