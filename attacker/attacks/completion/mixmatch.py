"""MixMatch's pieces (Berthelot et al., as Fu et al.'s model completion uses them), one function each."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch.nn import functional as F


def sharpen(probabilities: torch.Tensor, temperature: float) -> torch.Tensor:
    """p_i^(1/T) / Σ_j p_j^(1/T) per row: T < 1 pushes the guess towards one class."""
    powered = probabilities ** (1.0 / temperature)
    return powered / powered.sum(dim=1, keepdim=True)


def mixup_weight(rng: np.random.Generator, alpha: float) -> float:
    """λ ~ Beta(α, α), then max(λ, 1 − λ) so the mixed row stays closer to its first input."""
    lam = float(rng.beta(alpha, alpha))
    return max(lam, 1.0 - lam)


def mixup(rows: torch.Tensor, permutation: torch.Tensor, lam: float) -> torch.Tensor:
    """λ·x + (1 − λ)·x[perm]: applied alike to the inputs and to their (soft) targets."""
    return lam * rows + (1.0 - lam) * rows[permutation]


def linear_rampup(progress: float, length: float) -> float:
    """The unlabelled loss weight's ramp: progress / length, clipped to [0, 1]."""
    if length <= 0:
        return 1.0
    return float(np.clip(progress / length, 0.0, 1.0))


def semi_supervised_loss(logits_x: torch.Tensor, targets_x: torch.Tensor, logits_u: torch.Tensor,
                         targets_u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_x, L_u): soft-target cross-entropy on the labelled rows, and the mean squared error
    between the unlabelled rows' softmax and their guessed targets (mean over rows and classes)."""
    loss_x = -(F.log_softmax(logits_x, dim=1) * targets_x).sum(dim=1).mean()
    loss_u = ((F.softmax(logits_u, dim=1) - targets_u) ** 2).mean()
    return loss_x, loss_u


@torch.no_grad()
def ema_update(averages: Iterable[torch.Tensor], values: Iterable[torch.Tensor], decay: float) -> None:
    """a ← decay·a + (1 − decay)·v, in place, for every pair."""
    for average, value in zip(averages, values, strict=True):
        average.mul_(decay).add_(value, alpha=1.0 - decay)


def debiased(average: torch.Tensor, decay: float, updates: int) -> torch.Tensor:
    """An average started at zero, divided by 1 − decay^t (as Adam does its moments): the
    weighted mean of the t values seen, so a short training is not dominated by its start."""
    return average / (1.0 - decay ** updates) if updates else average


def shift_images(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each [C, H, W] image by its own random (dy, dx) in [−s, s]², zero-filled: the
    digit moves, its shape does not (no flips, which would change a digit's class)."""
    if max_shift <= 0:
        return images
    n, _, height, width = images.shape
    s = max_shift
    padded = F.pad(images, (s, s, s, s))
    dy = torch.randint(-s, s + 1, (n,), generator=generator)  # drawn on the CPU generator,
    dx = torch.randint(-s, s + 1, (n,), generator=generator)  # used on the images' device
    rows = torch.arange(height)[None, :] + s - dy[:, None]  # [n, H] rows of the padded image
    cols = torch.arange(width)[None, :] + s - dx[:, None]  # [n, W]
    device = images.device
    picked = padded[torch.arange(n, device=device)[:, None, None], :,
                    rows.to(device)[:, :, None], cols.to(device)[:, None, :]]
    return picked.permute(0, 3, 1, 2).contiguous()  # advanced indexing put channels last


def jitter(numeric: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """Tabular augmentation: Gaussian noise on standardised numeric fields."""
    if std <= 0 or numeric.numel() == 0:
        return numeric
    return numeric + std * torch.randn(numeric.shape, generator=generator).to(numeric.device)
