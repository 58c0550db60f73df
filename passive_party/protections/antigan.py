"""Anti-GAN (Luo & Zhang; ALGORITHMS.md §5): a GAN whose discriminator sees the party's first conv
block and whose generator is pushed towards a window variance v_e; each real image is then mixed
once with its own generated one, x̂ = μ·x + (1 − μ)·G(z)."""

from __future__ import annotations

import copy
import time

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from passive_party.protections.base import (
    PROTECTIONS,
    Protected,
    Protection,
    ProtectionFailed,
    ProtectionParams,
)
from splitleak.seeding import derive_seed, generator
from splitleak.settings import MAX_BATCH, MAX_RATE, MAX_WIDTH


class AntiGanParams(ProtectionParams):
    """Luo & Zhang's values by default (λ, v_e, window, μ, Adam 1e-4); the GAN's size and
    schedule are ours."""

    lambda_obf: float = Field(250.0, ge=0, description="λ: weight of the obfuscation loss")
    expected_variance: float = Field(0.5, gt=0, description="v_e: the window variance aimed at")
    window: int = Field(4, ge=2, le=64, description="s: side of the square windows of the obfuscation loss")
    mix: float = Field(0.5, gt=0, lt=1, description="μ: the real image's share of its mixture")
    latent_dim: int = Field(32, ge=1, le=MAX_WIDTH, description="size of the generator's noise z")
    steps: int = Field(1500, ge=1, le=1_000_000, description="GAN training steps")
    batch_size: int = Field(64, ge=2, le=MAX_BATCH,  # the generator's BatchNorm needs 2 rows
                            description="real (and generated) images per GAN step")
    lr: float = Field(1e-4, gt=0, le=MAX_RATE,
                      description="Adam learning rate of G and D (betas 0.5, 0.999)")
    pretrain_epochs: int = Field(3, ge=0, le=1000, description="epochs pre-training the first "
                                 "conv block")
    pretrain_lr: float = Field(1e-3, gt=0, le=MAX_RATE,
                               description="Adam learning rate of that pre-training")


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


def pretrain_extractor(block: nn.Module, images: torch.Tensor, epochs: int, lr: float,
                       seed: int, batch_size: int = 64) -> nn.Module:
    """The feature extractor C: a copy of the party's first conv block (its model is untouched),
    pre-trained as the encoder of a small autoencoder on the party's own images (a passive party
    has no labels); returned frozen, in eval mode."""
    extractor = copy.deepcopy(block)
    with torch.no_grad():
        features = extractor(images[:1])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "antigan", "decoder"))
        decoder = nn.Sequential(nn.Upsample(scale_factor=2),
                                nn.Conv2d(features.shape[1], images.shape[1], 3, padding=1))
    decoder.to(images.device)
    height, width = images.shape[2:]
    optimizer = torch.optim.Adam([*extractor.parameters(), *decoder.parameters()], lr=lr)
    order = generator(seed, "antigan", "pretrain")
    for _ in range(epochs):
        for rows in torch.randperm(images.shape[0], generator=order).split(batch_size):
            x = images[rows]
            loss = F.mse_loss(decoder(extractor(x))[:, :, :height, :width], x)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    extractor.eval()
    for parameter in extractor.parameters():
        parameter.requires_grad_(False)
    return extractor


class Generator(nn.Module):
    """z → an image, squashed into the real images' value range (an MNIST-style MLP generator
    with BatchNorm). Unconditional: a passive party has no labels."""

    def __init__(self, latent: int, shape: tuple[int, ...], low: float, high: float) -> None:
        super().__init__()
        self.shape = shape
        self.low, self.span = low, high - low
        size = int(torch.tensor(shape).prod())
        self.net = nn.Sequential(
            nn.Linear(latent, 256), nn.BatchNorm1d(256), nn.LeakyReLU(0.2),
            nn.Linear(256, 512), nn.BatchNorm1d(512), nn.LeakyReLU(0.2), nn.Linear(512, size))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.low + self.span * torch.sigmoid(self.net(z)).reshape(-1, *self.shape)


class Discriminator(nn.Module):
    """Real or generated, from the feature map C(x) only (Luo & Zhang Fig. 3), never raw pixels."""

    def __init__(self, extractor: nn.Module, features: int) -> None:
        super().__init__()
        self.extractor = extractor
        self.net = nn.Sequential(nn.Linear(features, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(self.extractor(images).flatten(1)).squeeze(1)


def train_generator(images: torch.Tensor, extractor: nn.Module, params: AntiGanParams,
                    seed: int) -> tuple[Generator, dict[str, float]]:
    """Luo & Zhang's Algorithm 1 without labels: per step, D ascends the GAN loss on C(x) vs
    C(G(z)); G descends its (non-saturating) GAN loss + λ·L_obf(G(z)). Last step's losses."""
    with torch.no_grad():
        width = extractor(images[:1]).flatten(1).shape[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "antigan", "init"))
        g = Generator(params.latent_dim, tuple(images.shape[1:]), float(images.min()),
                      float(images.max()))
        d = Discriminator(extractor, width)
    g.to(images.device)
    d.to(images.device)
    opt_g = torch.optim.Adam(g.parameters(), lr=params.lr, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.net.parameters(), lr=params.lr, betas=(0.5, 0.999))
    gen = generator(seed, "antigan", "train")
    size = min(params.batch_size, images.shape[0])
    real_target = torch.ones(size, device=images.device)
    fake_target = torch.zeros(size, device=images.device)
    losses = {}
    for _ in range(params.steps):
        rows = torch.randint(images.shape[0], (size,), generator=gen)
        # drawn on the CPU generator: the same rows and latents on every device
        fake = g(torch.randn(size, params.latent_dim, generator=gen).to(images.device))
        loss_d = (F.binary_cross_entropy_with_logits(d(images[rows]), real_target)
                  + F.binary_cross_entropy_with_logits(d(fake.detach()), fake_target))
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        adversarial = F.binary_cross_entropy_with_logits(d(fake), real_target)
        obfuscation = obfuscation_loss(fake, params.window, params.expected_variance)
        opt_g.zero_grad(set_to_none=True)
        (adversarial + params.lambda_obf * obfuscation).backward()
        opt_g.step()
        losses = {"discriminator": loss_d.item(), "generator": adversarial.item(),
                  "obfuscation": obfuscation.item()}
    return g, losses


def spread(images: torch.Tensor) -> float:
    """Mean over pixels of the standard deviation across images: how diverse a set is (a
    collapsed generator gives about 0, whatever z)."""
    return float(images.std(0).mean())


@PROTECTIONS.register("antigan")
class AntiGan(Protection):
    name = "antigan"
    Params = AntiGanParams
    params: AntiGanParams

    def check_images(self, image_shape: tuple[int, int, int]) -> str | None:
        _, height, width = image_shape
        if self.params.window > min(height, width):
            return (f"window = {self.params.window}: the party's images of {height}x{width} "
                    f"pixels hold no {self.params.window}x{self.params.window} window (allowed: "
                    f"2..{min(height, width)})")
        return None

    def __call__(self, images: torch.Tensor, first_block: nn.Module, seed: int) -> Protected:
        """Pre-train C from the party's first conv block, train the GAN, then mix every real
        image exactly once with its own generated image."""
        p = self.params
        started = time.process_time()
        extractor = pretrain_extractor(first_block, images, p.pretrain_epochs, p.pretrain_lr, seed)
        g, losses = train_generator(images, extractor, p, seed)
        g.eval()
        with torch.no_grad():
            z = torch.randn(images.shape[0], p.latent_dim, generator=generator(seed, "antigan", "mix"))
            generated = g(z.to(images.device))
        if not bool(torch.isfinite(generated).all()):
            raise ProtectionFailed(f"antigan diverged: its generator gives NaN or infinite pixels "
                                   f"after {p.steps} steps at lr = {p.lr:g} (a smaller "
                                   "protection.params.lr may fit), so it has no protected images "
                                   "to train on")
        mixed = mix(images, generated, p.mix)
        figures = {
            "final_losses": losses,
            "window_variance": {name: float(window_variances(x, p.window).mean())
                                for name, x in (("real", images), ("generated", generated),
                                                ("mixed", mixed))},
            "obfuscation_loss": {name: float(obfuscation_loss(x, p.window, p.expected_variance))
                                 for name, x in (("real", images), ("generated", generated))},
            "pixel_spread": {"real": spread(images), "generated": spread(generated)},
            "rows": int(images.shape[0]), "cpu_seconds": round(time.process_time() - started, 1)}
        return Protected(mixed, figures)
