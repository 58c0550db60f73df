"""Optimizers by config name, the same for every party."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from splitleak.config import OptimizerConfig


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    params = list(params)
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    return torch.optim.Adagrad(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
