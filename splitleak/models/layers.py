"""Building blocks shared by the model families: field encoder, ReLU stacks, conv blocks."""

from __future__ import annotations

import torch
from torch import nn


class FieldEncoder(nn.Module):
    """Numeric fields as they are, each categorical field through its own embedding."""

    def __init__(self, num_numeric: int, cardinalities: tuple[int, ...], dim: int,
                 init_std: float = 0.01) -> None:
        super().__init__()
        self.num_numeric = num_numeric
        self.embeddings = nn.ModuleList(nn.Embedding(c, dim) for c in cardinalities)
        for emb in self.embeddings:  # small start: N(0, 1) rows would swamp the numerics
            nn.init.normal_(emb.weight, std=init_std)
        self.out_features = num_numeric + dim * len(cardinalities)

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        parts = [numeric] if self.num_numeric else []
        parts += [emb(categorical[:, i]) for i, emb in enumerate(self.embeddings)]
        return torch.cat(parts, dim=1)


def relu_stack(in_features: int, widths: list[int]) -> tuple[nn.Sequential, int]:
    """Linear+ReLU per width; returns the stack and its output width."""
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        in_features = width
    return nn.Sequential(*layers), in_features


def conv_blocks(in_channels: int, channels: list[int]) -> nn.Sequential:
    """3x3 conv (same padding) + ReLU + 2x2 max-pool (ceil) per entry."""
    layers: list[nn.Module] = []
    for out in channels:
        layers += [nn.Conv2d(in_channels, out, 3, padding=1), nn.ReLU(),
                   nn.MaxPool2d(2, ceil_mode=True)]
        in_channels = out
    return nn.Sequential(*layers)
