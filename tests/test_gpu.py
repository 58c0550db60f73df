"""On a CUDA device: every plug-in computes there what it computes on the CPU, the distributed
run equals the in-process one bit for bit in deterministic mode, and the attacker trains there.

Marked `gpu`: skipped, with the reason, where torch sees no CUDA device (CI never has one);
`scripts/gpu_check.sh` runs them on a GPU machine. SPLITLEAK_GPU_TEST_DEVICE=cpu runs them on
the CPU instead: a dry run of the tests' own logic (CPU against CPU), not of CUDA."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from label_party.defenses import DEFENSES, build_defense
from label_party.objectives import build_objective
from orchestration.reference import run_reference
from orchestration.run import run_distributed
from splitleak.artifacts.metrics import read_metrics
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import parse_config
from splitleak.inputs import PartyInputs
from tests.conftest import scaled, small_config
from tests.test_defenses import PARAMS as DEFENSE_PARAMS
from tests.test_defenses import binary_class_gradients, context
from tests.test_objectives import PARAMS as OBJECTIVE_PARAMS
from tests.test_objectives import batch, objective_case

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("SPLITLEAK_GPU_TEST_DEVICE", "cuda")
CUDA = torch.device(DEVICE)
# float32 on a GPU is not the CPU's float32: sums run in other orders (and matrix products may
# use TF32). What the same math gives on both stays within this relative distance.
TOLERANCE = 2e-3


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    scale = max(float(b.abs().max()), 1e-6)
    return float((a - b).abs().max()) / scale <= TOLERANCE


@pytest.mark.parametrize("name", sorted(DEFENSE_PARAMS))
def test_every_defense_gives_on_cuda_what_it_gives_on_the_cpu(name: str) -> None:
    assert set(DEFENSE_PARAMS) == set(DEFENSES.names())
    gen = torch.Generator().manual_seed(7)
    gradient = torch.randn(64, 16, generator=gen)
    labels = (torch.rand(64, generator=gen) < 0.3).long()
    results = []
    for device in ("cpu", CUDA):
        defense = build_defense(name, DEFENSE_PARAMS[name])
        g, y = gradient.to(device), labels.to(device)
        ctx = context(y, seed=3, class_gradients=binary_class_gradients(g))
        out = defense(g, ctx)
        assert out.device.type == torch.device(device).type, f"{name} left the device"
        results.append((out, ctx.diagnostics))
    (cpu, cpu_diag), (gpu, gpu_diag) = results
    assert close(gpu, cpu), name  # the same draws: every generator is a CPU one
    assert cpu_diag.keys() == gpu_diag.keys()


@pytest.mark.parametrize("name", sorted(OBJECTIVE_PARAMS))
def test_every_objective_trains_on_cuda_as_on_the_cpu(name: str, tmp_path: Path) -> None:
    losses = {}
    for device in ("cpu", CUDA):
        cfg, setup = objective_case(name, tmp_path)
        own = setup.own_inputs.to(device) if setup.own_inputs is not None else None
        setup = type(setup)(**{**setup.__dict__, "own_inputs": own, "device": torch.device(device)})
        objective = build_objective(name, OBJECTIVE_PARAMS[name], setup)
        objective.split_backward = device != "cpu"  # as a label party with cores to spare
        seen = []
        for step in range(3):
            acts, own_rows, ids, labels = batch(setup, seed=step)
            acts = [a.detach().to(device).requires_grad_(True) for a in acts]
            result = objective.train_step(acts, own_rows, ids, labels.to(device))
            assert all(g.device.type == torch.device(device).type for g in result.gradients)
            seen.append(result.loss)
        logits = objective.predict([a.detach() for a in acts], own_rows)
        losses[device if device == "cpu" else "cuda"] = (seen, logits)
    (cpu_loss, cpu_logits), (gpu_loss, gpu_logits) = losses["cpu"], losses["cuda"]
    assert np.allclose(cpu_loss, gpu_loss, rtol=TOLERANCE, atol=1e-5), (name, cpu_loss, gpu_loss)
    assert close(gpu_logits, cpu_logits), name


def _resnet_digits(tmp_path: Path, **run: object) -> dict:
    return small_config(
        tmp_path, run={"device": DEVICE, **run},
        dataset={"name": "digits", "test_fraction": 0.2},
        features={"passive": [[0, 4], [4, 8]]},
        model={"kind": "resnet", "depth": 18, "layers": [64, 32]},
        training={"batch_size": 32, "epochs": 1, "max_steps": 12, "eval_interval": 6,
                  "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}},
        topology={"passive_parties": 2, "tls": True, "step_deadline_s": scaled(60),
                  "join_deadline_s": scaled(120)},
        attacker={"enabled": True, "record_first_layer": True})


def _trained(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall"} for r in read_metrics(run_dir.metrics)]


def _same_both_ways(data: dict) -> tuple[RunDir, RunDir]:
    """The distributed run and its in-process reference, which it equals bit for bit
    (deterministic mode)."""
    cfg = parse_config(data)
    distributed, in_process = create_run_dir(cfg), create_run_dir(cfg, suffix="-ref")
    run_distributed(cfg, distributed)
    run_reference(cfg, in_process)
    assert _trained(distributed) == _trained(in_process)
    return distributed, in_process


def test_resnet_run_on_cuda_is_the_same_distributed_and_in_process(tmp_path: Path) -> None:
    distributed, _ = _same_both_ways(_resnet_digits(tmp_path, deterministic=True))
    summary = json.loads(distributed.summary.read_text())
    assert set(summary["devices"].values()) == {"cuda:0" if CUDA.type == "cuda" else "cpu"}
    label = json.loads((distributed.label_party / "timing.json").read_text())
    assert CUDA.type != "cuda" or label["gpu_max_allocated_mib"] > 0


def _graphed_digits(tmp_path: Path, cuda_graphs: bool) -> dict:
    """A whole epoch (its last batch shorter: that one runs eagerly), nothing hooked."""
    data = _resnet_digits(tmp_path, deterministic=True, cuda_graphs=cuda_graphs)
    del data["training"]["max_steps"]
    data["training"]["eval_interval"] = 20
    data["attacker"] = {"enabled": True, "record_first_layer": False}
    return data


def test_cuda_graphs_run_is_the_same_distributed_and_in_process(tmp_path: Path) -> None:
    distributed, in_process = _same_both_ways(_graphed_digits(tmp_path, cuda_graphs=True))
    ran = "graphs" if CUDA.type == "cuda" else f"eager: the party computes on {CUDA}, not on CUDA"
    for k in (1, 2):
        party = json.loads((distributed.passive_party(k) / "timing.json").read_text())
        assert party["cuda_graphs"] == ran
    label = json.loads((in_process.label_party / "timing.json").read_text())
    assert label["cuda_graphs"] == {"1": ran, "2": ran}


def test_cuda_graphs_train_as_the_eager_steps_do(tmp_path: Path) -> None:
    losses = {}
    for graphs in (False, True):
        cfg = parse_config(_graphed_digits(tmp_path / str(graphs), cuda_graphs=graphs))
        run = create_run_dir(cfg)
        run_reference(cfg, run)
        losses[graphs] = [r["loss"] for r in read_metrics(run.metrics) if r["type"] == "train"]
    assert len(losses[True]) == len(losses[False]) > 40
    assert np.allclose(losses[True], losses[False], rtol=TOLERANCE, atol=1e-5)


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_bf16_run_on_cuda_trains(tmp_path: Path, cuda_graphs: bool) -> None:
    data = _resnet_digits(tmp_path, deterministic=False, cuda_graphs=cuda_graphs)
    data["training"]["precision"] = "bf16"
    data["attacker"]["record_first_layer"] = False  # a hooked layer would keep a party eager
    cfg = parse_config(data)
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    losses = [r["loss"] for r in read_metrics(run.metrics) if r["type"] == "train"]
    assert len(losses) == 12 and all(np.isfinite(losses))
    ran = json.loads(run.label_timing.read_text())["cuda_graphs"]
    assert set(ran.values()) == {"graphs" if cuda_graphs and CUDA.type == "cuda" else ran["1"]}
    assert cuda_graphs or ran["1"] == "eager: not asked"


def test_white_box_snapshots_record_a_model_on_cuda(tmp_path: Path) -> None:
    """CAFE's and EXACT's snapshots of a model (and its gradients) that lives on the device."""
    from splitleak.threat import ThreatConfig
    from splitleak.white_box import SnapshotWriter, read_snapshot, snapshot_files

    threat = ThreatConfig.model_validate({"parties": {"1": {"white_box": True}},
                                          "white_box": {"every": 1, "max_snapshots": 1}})
    model = torch.nn.Linear(3, 2).to(CUDA)
    SnapshotWriter(tmp_path / "wb", threat).record(0, 0, model, {"g": torch.ones(2, device=CUDA)})
    step, state = read_snapshot(snapshot_files(tmp_path / "wb")[0])
    assert step == 0 and torch.equal(state["weight"], model.weight.detach().cpu())
    assert torch.equal(state["g"], torch.ones(2))


def test_model_completion_and_anti_gan_run_on_cuda(tmp_path: Path) -> None:
    from attacker.analysis.analyze import analyze

    data = small_config(
        tmp_path, run={"device": DEVICE}, dataset={"name": "digits", "test_fraction": 0.2},
        features={"passive": [[0, 4], [4, 8]]},
        model={"kind": "cnn", "channels": [8], "layers": [16], "cut_layer": 1},
        training={"batch_size": 64, "epochs": 1},
        protection={"name": "antigan", "parties": [2], "params": {"steps": 20,
                                                                  "pretrain_epochs": 1}},
        threat={"parties": {"1": {"curious": True, "labelled_per_class": 4}}},
        attacker={"attacks": [{"name": "model_completion", "steps": 30, "baselines": False}]})
    cfg = parse_config(data)
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    summary = analyze(run.root, device=DEVICE)
    completion = [e for e in summary["leak"] if e["attack"].startswith("model_completion")]
    assert completion and completion[0]["completion"]["device"].startswith(CUDA.type)
    protection = json.loads(run.protection(2).read_text())
    assert protection["rows"] > 0


def test_a_child_forked_from_the_zygote_computes_on_cuda(tmp_path: Path) -> None:
    from orchestration import zygote_client

    zygote = zygote_client.Zygote.start()
    try:
        child = zygote.spawn("tests.zygote_probe", ["cuda", DEVICE], tmp_path / "cuda.log",
                             dict(os.environ))
        assert child.wait(scaled(120)) == 0, (tmp_path / "cuda.log").read_text()
        assert "cuda sum=14.0" in (tmp_path / "cuda.log").read_text()
    finally:
        zygote.close()


def test_party_inputs_move_to_the_device_once() -> None:
    inputs = PartyInputs(torch.rand(10, 3), torch.zeros(10, 0, dtype=torch.int64), None)  # type: ignore[arg-type]
    on_gpu = inputs.to(CUDA)
    numeric, _ = on_gpu.rows(torch.tensor([1, 2]))
    assert numeric.device.type == CUDA.type and torch.equal(numeric.cpu(), inputs.numeric[1:3])
