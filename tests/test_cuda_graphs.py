"""run.cuda_graphs: which parties replay their train step as CUDA graphs, and that capturing one
leaves the run's numbers as they were. The capture itself needs CUDA (tests/test_gpu.py); here a
stand-in runs torch's warm-up steps and hands the module back, on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from orchestration.cli import main
from passive_party.client import load_bottom
from splitleak.config import parse_config
from splitleak.cuda_graphs import GraphedTrainStep, ineligible
from tests.conftest import small_config

BATCH = 16


def warm_then_eager(module: nn.Module, sample_args: tuple[torch.Tensor, ...],
                    allow_unused_input: bool = False) -> nn.Module:
    """torch.cuda.make_graphed_callables's side effects on the CPU: its three warm-up forwards
    and backwards (batch norm's statistics move, no .grad is touched); the module back, eager."""
    params = [p for p in module.parameters() if p.requires_grad]
    for _ in range(3):
        out = module(*sample_args)
        torch.autograd.grad(out, params, torch.ones_like(out), allow_unused=allow_unused_input)
    return module


def _config(tmp_path: Path, **run: object):
    return parse_config(small_config(
        tmp_path, run={"device": "cpu", "torch_threads": 1, **run},
        dataset={"name": "digits", "test_fraction": 0.2},
        features={"passive": [[0, 4], [4, 8]]},
        model={"kind": "resnet", "depth": 18, "layers": [32]},
        training={"batch_size": BATCH, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}}))


def _steps(bottom, batches: list[np.ndarray]) -> list[torch.Tensor]:
    """Train forwards and backwards (a fixed cut gradient); what each forward sent."""
    sent = []
    for ids in batches:
        out = bottom.forward(ids, train=True)
        sent.append(out)
        bottom.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return sent


def test_a_captured_step_trains_as_the_eager_one_bit_for_bit(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    eager, graphed = load_bottom(cfg, 1), load_bottom(cfg, 1)
    captures: list[tuple[torch.Size, ...]] = []

    def capture(module: nn.Module, args: tuple[torch.Tensor, ...], **kw: object) -> nn.Module:
        captures.append(tuple(a.shape for a in args))
        return warm_then_eager(module, args, **kw)

    graphed.graphs = GraphedTrainStep(graphed.model, BATCH, bf16=False, capture=capture)
    rng = np.random.default_rng(0)
    batches = [rng.choice(1000, size, replace=False) for size in (BATCH, BATCH, 7, BATCH)]
    for a, b in zip(_steps(eager, batches), _steps(graphed, batches), strict=True):
        assert torch.equal(a, b)
    assert len(captures) == 1 and captures[0][0][0] == BATCH  # once, at the run's batch size
    assert graphed.graphs.replays == 3  # the 7-row batch ran eagerly
    for (name, a), b in zip(eager.model.state_dict().items(), graphed.model.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name  # batch norm's statistics: the warm-up left no trace
    assert graphed.cuda_graphs == "graphs"


def test_a_failed_capture_leaves_the_party_eager_and_says_why(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    eager, failing = load_bottom(cfg, 1), load_bottom(cfg, 1)

    def capture(module: nn.Module, args: tuple[torch.Tensor, ...], **kw: object) -> nn.Module:
        warm_then_eager(module, args, **kw)  # moves the statistics, then fails
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    failing.graphs = GraphedTrainStep(failing.model, BATCH, bf16=False, capture=capture)
    batches = [np.arange(BATCH), np.arange(BATCH, 2 * BATCH)]
    for a, b in zip(_steps(eager, batches), _steps(failing, batches), strict=True):
        assert torch.equal(a, b)
    assert failing.cuda_graphs == "eager: operation not permitted when stream is capturing"
    assert failing.graphs.replays == 0


def test_which_parties_can_replay_a_graph(tmp_path: Path) -> None:
    cuda = torch.device("cuda", 0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    assert ineligible(model, cuda, hooked=False, deviating=False) is None
    assert "on cpu" in ineligible(model, torch.device("cpu"), False, False)
    assert "first layer" in ineligible(model, cuda, hooked=True, deviating=False)
    assert "integrity attack" in ineligible(model, cuda, hooked=False, deviating=True)
    assert "dropout" in ineligible(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.2)), cuda, False, False)
    assert ineligible(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0)), cuda, False, False) is None
    on_cpu = load_bottom(_config(tmp_path, cuda_graphs=True), 1)
    assert on_cpu.graphs is None
    assert on_cpu.cuda_graphs == "eager: the party computes on cpu, not on CUDA"
    assert load_bottom(_config(tmp_path), 1).cuda_graphs == "eager: not asked"


def test_bench_refuses_cuda_graphs_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the bench would measure the graphs")
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--cuda-graphs", "--quick"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--cuda-graphs" in err and "CUDA device" in err, err
