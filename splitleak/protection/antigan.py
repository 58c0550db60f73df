"""Anti-GAN (Luo & Zhang; ALGORITHMS.md §5): a GAN whose discriminator sees the party's first conv
block and whose generator is pushed towards a window variance v_e; each real image is then mixed
once with a generated one, x̂ = μ·x + (1 − μ)·G(z)."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.nn import functional as F

from splitleak.seeding import derive_seed, generator


class AntiGanParams(BaseModel):
    """Luo & Zhang's values by default (λ, v_e, window, μ); the GAN's size and schedule are ours."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lambda_obf: float = Field(250.0, ge=0, description="λ: weight of the obfuscation loss")
    expected_variance: float = Field(0.5, gt=0, description="v_e: the window variance aimed at")
    window: int = Field(4, ge=2, description="s: side of the square windows of the obfuscation loss")
    mix: float = Field(0.5, gt=0, lt=1, description="μ: the real image's share of its mixture")
    latent_dim: int = Field(32, ge=1, description="size of the generator's noise z")
    steps: int = Field(1500, ge=1, description="GAN training steps")
    batch_size: int = Field(64, ge=1, description="real (and generated) images per GAN step")
    lr: float = Field(2e-4, gt=0, description="Adam learning rate of G and D (betas 0.5, 0.999)")
    pretrain_epochs: int = Field(3, ge=0, description="epochs pre-training the first conv block")
    pretrain_lr: float = Field(1e-3, gt=0, description="Adam learning rate of that pre-training")


@dataclass(frozen=True)
class Protected:
    """The mixed images (what the party trains on), the generated ones, and the GAN's figures."""

    images: torch.Tensor
    generated: torch.Tensor
    figures: dict[str, Any]


def window_variances(images: torch.Tensor, window: int) -> torch.Tensor:
    """Population variance of every non-overlapping s×s window, per channel: [n, C, H/s, W/s].
    Rows and columns past the last whole window are left out."""
    n, c, h, w = images.shape
    rows, cols = h // window, w // window
    if rows == 0 or cols == 0:
        raise ValueError(f"images of {h}x{w} pixels hold no {window}x{window} window")
    blocks = images[:, :, : rows * window, : cols * window].reshape(n, c, rows, window, cols, window)
    return blocks.var(dim=(3, 5), unbiased=False)


def obfuscation_loss(images: torch.Tensor, window: int, expected_variance: float) -> torch.Tensor:
    """Luo & Zhang Eq. (2): Σ_windows (Var(w_i) − v_e)², averaged over the batch's images."""
    deviation = (window_variances(images, window) - expected_variance) ** 2
    return deviation.flatten(1).sum(1).mean()


def mix(images: torch.Tensor, generated: torch.Tensor, mu: float) -> torch.Tensor:
    """x̂ = μ·x + (1 − μ)·x′, row by row (each real image with its own generated one)."""
    if images.shape != generated.shape:
        raise ValueError(f"cannot mix images {list(images.shape)} with {list(generated.shape)}")
    return mu * images + (1.0 - mu) * generated


def _batches(count: int, size: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(count, (min(size, count),), generator=gen)


def pretrain_extractor(block: nn.Module, images: torch.Tensor, epochs: int, lr: float,
                       seed: int, batch_size: int = 64) -> nn.Module:
    """The feature extractor C: a copy of the party's first conv block (its model is untouched),
    pre-trained as the encoder of a small autoencoder on the party's own images (a passive party
    has no labels); returned frozen, in eval mode."""
    extractor = copy.deepcopy(block)
    channels = images.shape[1]
    with torch.no_grad():
        features = extractor(images[:1])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "antigan", "decoder"))
        decoder = nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(features.shape[1], channels, 3,
                                                                          padding=1))
    height, width = images.shape[2:]
    optimizer = torch.optim.Adam([*extractor.parameters(), *decoder.parameters()], lr=lr)
    order = generator(seed, "antigan", "pretrain")
    for _ in range(epochs):
        for rows in torch.randperm(images.shape[0], generator=order).split(batch_size):
            x = images[rows]
            rebuilt = decoder(extractor(x))[:, :, :height, :width]
            loss = F.mse_loss(rebuilt, x)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    extractor.eval()
    for parameter in extractor.parameters():
        parameter.requires_grad_(False)
    return extractor


class Generator(nn.Module):
    """z (and a one-hot label, CGAN) → an image, squashed into the real images' value range."""

    def __init__(self, latent: int, classes: int, shape: tuple[int, ...], low: float, high: float) -> None:
        super().__init__()
        self.shape = shape
        self.classes = classes
        self.low, self.span = low, high - low
        size = int(torch.tensor(shape).prod())
        self.net = nn.Sequential(nn.Linear(latent + classes, 256), nn.LeakyReLU(0.2),
                                 nn.Linear(256, 512), nn.LeakyReLU(0.2), nn.Linear(512, size))

    def forward(self, z: torch.Tensor, onehot: torch.Tensor | None = None) -> torch.Tensor:
        x = torch.cat([z, onehot], 1) if onehot is not None else z
        return self.low + self.span * torch.sigmoid(self.net(x)).reshape(-1, *self.shape)


class Discriminator(nn.Module):
    """Real or generated, from the feature map C(x) only (Luo & Zhang Fig. 3), never raw pixels."""

    def __init__(self, extractor: nn.Module, features: int, classes: int) -> None:
        super().__init__()
        self.extractor = extractor
        self.net = nn.Sequential(nn.Linear(features + classes, 256), nn.LeakyReLU(0.2),
                                 nn.Linear(256, 1))

    def forward(self, images: torch.Tensor, onehot: torch.Tensor | None = None) -> torch.Tensor:
        h = self.extractor(images).flatten(1)
        return self.net(torch.cat([h, onehot], 1) if onehot is not None else h).squeeze(1)


def train_generator(images: torch.Tensor, extractor: nn.Module, params: AntiGanParams, seed: int,
                    labels: torch.Tensor | None = None, num_classes: int | None = None
                    ) -> tuple[Generator, dict[str, float]]:
    """G against D(C(·)) with G's loss + λ·L_obf(G(z)); conditional on the label when `labels`
    are given (the label party's own images), a plain GAN otherwise (a passive party's)."""
    classes = (num_classes or int(labels.max()) + 1) if labels is not None else 0
    with torch.no_grad():
        width = extractor(images[:1]).flatten(1).shape[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "antigan", "init"))
        g = Generator(params.latent_dim, classes, tuple(images.shape[1:]), float(images.min()),
                      float(images.max()))
        d = Discriminator(extractor, width, classes)
    opt_g = torch.optim.Adam(g.parameters(), lr=params.lr, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.net.parameters(), lr=params.lr, betas=(0.5, 0.999))
    gen = generator(seed, "antigan", "train")
    real_target = torch.ones(min(params.batch_size, images.shape[0]))
    fake_target = torch.zeros_like(real_target)
    losses = {"discriminator": 0.0, "generator": 0.0, "obfuscation": 0.0}
    for _ in range(params.steps):
        rows = _batches(images.shape[0], params.batch_size, gen)
        onehot = F.one_hot(labels[rows], classes).float() if classes else None
        z = torch.randn(rows.shape[0], params.latent_dim, generator=gen)
        fake = g(z, onehot)
        loss_d = (F.binary_cross_entropy_with_logits(d(images[rows], onehot), real_target)
                  + F.binary_cross_entropy_with_logits(d(fake.detach(), onehot), fake_target))
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        adversarial = F.binary_cross_entropy_with_logits(d(fake, onehot), real_target)
        obfuscation = obfuscation_loss(fake, params.window, params.expected_variance)
        loss_g = adversarial + params.lambda_obf * obfuscation
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()
        losses = {"discriminator": float(loss_d), "generator": float(adversarial),
                  "obfuscation": float(obfuscation)}
    return g, losses


@torch.no_grad()
def generate(g: Generator, count: int, latent: int, seed: int,
             labels: torch.Tensor | None = None) -> torch.Tensor:
    """One fresh G(z) (G(z | y) with labels) per row."""
    gen = generator(seed, "antigan", "mix")
    z = torch.randn(count, latent, generator=gen)
    onehot = F.one_hot(labels, g.classes).float() if labels is not None and g.classes else None
    return g(z, onehot)


def protect(images: torch.Tensor, block: nn.Module, params: AntiGanParams, seed: int,
            labels: torch.Tensor | None = None, num_classes: int | None = None) -> Protected:
    """Pre-train C from the party's first conv `block`, train the GAN, then mix every real image
    exactly once with its own generated image."""
    started = time.process_time()
    extractor = pretrain_extractor(block, images, params.pretrain_epochs, params.pretrain_lr, seed)
    g, losses = train_generator(images, extractor, params, seed, labels, num_classes)
    g.eval()
    generated = generate(g, images.shape[0], params.latent_dim, seed, labels)
    mixed = mix(images, generated, params.mix)
    real_var = window_variances(images, params.window)
    fake_var = window_variances(generated, params.window)
    figures = {
        "steps": params.steps, "conditional": labels is not None, "final_losses": losses,
        "window_variance": {"real": float(real_var.mean()), "generated": float(fake_var.mean()),
                            "mixed": float(window_variances(mixed, params.window).mean())},
        "obfuscation_loss": {
            "real": float(obfuscation_loss(images, params.window, params.expected_variance)),
            "generated": float(obfuscation_loss(generated, params.window, params.expected_variance))},
        "rows": int(images.shape[0]), "cpu_seconds": round(time.process_time() - started, 1)}
    return Protected(mixed, generated, figures)
