"""The configured optimizers step in torch's multi-tensor form, and give exactly the numbers of
the one-tensor-at-a-time form (what every run before used)."""

from __future__ import annotations

import pytest
import torch

from splitleak.config import OptimizerConfig
from splitleak.optim import make_optimizer

SETTINGS = [OptimizerConfig(name="adam", lr=1e-2, weight_decay=1e-4),
            OptimizerConfig(name="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4),
            OptimizerConfig(name="adagrad", lr=1e-2, weight_decay=1e-4)]


def _trained(cfg: OptimizerConfig, foreach: bool | None) -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 4), torch.nn.Flatten(),
                                torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    optimizer = make_optimizer(model.parameters(), cfg)
    if foreach is not None:
        for group in optimizer.param_groups:
            group["foreach"] = foreach
    data = torch.Generator().manual_seed(1)
    for _ in range(40):
        x = torch.randint(0, 50, (16, 3), generator=data)
        y = torch.randint(0, 3, (16,), generator=data)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda c: c.name)
def test_multi_tensor_steps_equal_single_tensor_steps_bit_for_bit(cfg: OptimizerConfig) -> None:
    assert all(g["foreach"] for g in make_optimizer([torch.nn.Parameter(torch.zeros(2))],
                                                    cfg).param_groups)
    assert torch.equal(_trained(cfg, None), _trained(cfg, False))
