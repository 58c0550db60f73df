"""Building blocks shared by the model families: field encoder, ReLU stacks, conv blocks."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class FieldEncoder(nn.Module):
    """Numeric fields as they are, each categorical field through its own embedding."""

    def __init__(self, num_numeric: int, cardinalities: tuple[int, ...], dim: int,
                 init_std: float = 0.01) -> None:
        super().__init__()
        self.num_numeric = num_numeric
        embeddings = [nn.Embedding(c, dim) for c in cardinalities]
        for emb in embeddings:  # small start: N(0, 1) rows would swamp the numerics
            nn.init.normal_(emb.weight, std=init_std)
        self.embeddings = nn.ModuleList(embeddings)
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


class Bottleneck(nn.Module):
    """MID's variational bottleneck (label_party/objectives/mid.py): h → (μ, σ) → z → decoded
    activation; z = μ when no noise is given."""

    def __init__(self, dim: int, width: int, hidden: int, shift: float) -> None:
        super().__init__()
        self.width = width
        self.shift = shift
        self.encoder = nn.Linear(dim, 2 * width)
        self.decoder = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def encode(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, pre = self.encoder(flat).split(self.width, dim=1)
        return mu, F.softplus(pre - self.shift)

    def forward(self, activation: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        mu, sigma = self.encode(activation.reshape(activation.shape[0], -1))
        z = mu if noise is None else mu + sigma * noise
        return self.decoder(z).reshape(activation.shape)

    def kl(self, activation: torch.Tensor) -> torch.Tensor:
        """mean over rows of Σ_i KL(N(μ_i, σ_i²) ‖ N(0, 1))."""
        mu, sigma = self.encode(activation.reshape(activation.shape[0], -1))
        per_row = 0.5 * (mu.square() + sigma.square() - 1.0) - torch.log(sigma)
        return per_row.sum(1).mean()
