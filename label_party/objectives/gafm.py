"""GAFM (Han & Guan): a WGAN on the label distribution plus noisy-label CE, binary only.

f(X) is the aggregate of the parties' cut-layer outputs (sum, or mean as in the paper's
3-party runs). The label party replaces the top model by a generator G (2 layers, LeakyReLU,
sigmoid output) giving the prediction Ŷ = G(f(X)), and trains a critic D: R → R (2 layers,
LeakyReLU). Per step (Algorithm A.1):

1. critic ascent on L_GAN = E[D(Y + ε)] − E[D(Ŷ)], ε ~ N(0, σ²), then clip every critic
   parameter to [−c, c];
2. generator descent on L_GAN;
3. the gradient sent to the parties is γ·∇_f L_GAN/‖∇_f L_GAN‖ + ∇_f L_CE/‖∇_f L_CE‖ (norms
   over the whole [B, d] tensor, taken with the updated G and D), where
   L_CE = BCE(σ(Σ_d f(X)), Ỹ) with the randomized-response soft labels Ỹ = 0.5 ± u,
   u ~ U(0, Δ) drawn afresh for every row of every step. With mean aggregation the parties
   receive the chain rule of that gradient through the mean (1/N of it).

Orientation (project choice): the GAN matches only the marginal of Ŷ to that of Y, and G never
sees a label, so a decreasing G (Ŷ → 1 − Y, the second case of the paper's Appendix B) fits the
GAN as well as an increasing one; which one a run ends with depends on the initialisation (2 of
6 seeds on breast_cancer at lr 1e-3 ended decreasing, test AUC ≈ 0.05). With `orientation =
"train"` the label party keeps an exponential moving average over training batches of mean(Ŷ | Y
= 1) − mean(Ŷ | Y = 0), computed from its own labels, and `predict` returns logit(1 − Ŷ) =
−logit(Ŷ) while it is negative. Nothing is sent to the parties: their gradients are the same
either way. `orientation = "as_is"` always returns logit(Ŷ).

G and D use Adam (the paper's optimizer) whatever `training.optimizer` says; the passive
parties keep their configured optimizers. Utility is measured on Ŷ: `predict` returns logit(Ŷ)
(oriented as above). The paper gives no hidden widths for G and D: 32 each by default.

Configuration: GAFM has no top model, so it requires `model.top = "none"` (each party's model
then ends in a linear layer of width 1 with BCE: f(X) ∈ R, the paper's set-up) and the BCE loss;
its own `aggregation` parameter chooses F = sum or mean (`model.aggregation` is forced to "sum"
by `top = "none"` and does not apply). The label party holds only the labels, as in the paper:
`features.label_party` is refused.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, PositiveFloat
from torch import nn
from torch.nn import functional as F

from label_party.objectives.base import (
    OBJECTIVES,
    Objective,
    ObjectiveParams,
    ObjectiveSetup,
    Own,
    StepResult,
    activation_gradients,
)
from splitleak.config import ConfigError, ExperimentConfig
from splitleak.seeding import derive_seed, generator
from splitleak.settings import MAX_RATE, MAX_RESTARTS, MAX_SCALE, MAX_WIDTH

# The paper's per-dataset (σ, Δ, γ) (Table D.1).
PRESETS: dict[str, tuple[float, float, float]] = {
    "spambase": (0.01, 0.05, 1.0),
    "imdb": (0.01, 0.1, 1.0),
    "criteo": (0.01, 0.5, 1.0),
    "isic": (0.01, 0.05, 20.0),
}
DEFAULT_PRESET = "spambase"  # used for any of σ, Δ, γ given neither directly nor by a preset


class GAFMParams(ObjectiveParams):
    """An explicit sigma / delta / gamma overrides the preset's value."""

    preset: Literal["spambase", "imdb", "criteo", "isic"] | None = None
    sigma: float | None = Field(None, ge=0.0, le=MAX_SCALE)  # std of the noise added to the real labels
    delta: float | None = Field(None, ge=0.0, le=0.5)  # randomized-response range of u
    gamma: float | None = Field(None, gt=0.0, le=MAX_SCALE)  # weight of the normalised GAN gradient
    clip: PositiveFloat = 0.1  # critic weight clipping c
    aggregation: Literal["sum", "mean"] = "sum"  # F: how f(X) combines the parties' outputs
    generator_hidden: int = Field(32, gt=0, le=MAX_WIDTH)
    critic_hidden: int = Field(32, gt=0, le=MAX_WIDTH)
    generator_lr: float | None = Field(None, gt=0.0, le=MAX_RATE)  # None: the label party's configured lr
    critic_lr: float | None = Field(None, gt=0.0, le=MAX_RATE)  # None: the label party's configured lr
    critic_steps: int = Field(1, gt=0, le=MAX_RESTARTS)  # critic updates per step (Algorithm A.1: 1)
    # "train": predict with the orientation of Ŷ the training batches favour (see module doc);
    # "as_is": always logit(Ŷ).
    orientation: Literal["train", "as_is"] = "train"
    orientation_decay: float = Field(0.9, ge=0.0, lt=1.0)  # EMA decay of the batch statistic

    def resolved(self) -> tuple[float, float, float]:
        """(σ, Δ, γ) after the preset and the explicit values."""
        base = PRESETS[self.preset or DEFAULT_PRESET]
        sigma, delta, gamma = (v if v is not None else b
                               for v, b in zip((self.sigma, self.delta, self.gamma), base, strict=True))
        return float(sigma), float(delta), float(gamma)


def not_binary(dataset: str, num_classes: int) -> str:
    return (f"objective gafm is binary; {dataset} has {num_classes} classes (allowed: a "
            "two-class dataset)")


def check_setup(cfg: ExperimentConfig) -> None:
    """What GAFM needs from the rest of the config (the dataset's class count is checked later)."""
    if cfg.model.top != "none":
        raise ConfigError("objective gafm replaces the top model by its generator: set "
                          "model.top = 'none' (with aggregation = 'sum' and cut_layer = the last "
                          "layer); choose sum or mean of the parties' outputs with "
                          "objective.aggregation")
    if cfg.training.loss == "ce":
        raise ConfigError("objective gafm is binary with one output per party: set "
                          "training.loss = 'auto' or 'bce'")
    if cfg.features.label_party is not None:
        raise ConfigError("objective gafm: the label party holds only the labels (as in GAFM); "
                          "remove features.label_party")


def critic_network(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(1, hidden), nn.LeakyReLU(), nn.Linear(hidden, 1))


def generator_network(inputs: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.LeakyReLU(), nn.Linear(hidden, 1),
                         nn.Sigmoid())


def normalised_sum(gan_gradient: torch.Tensor, ce_gradient: torch.Tensor,
                   gamma: float) -> torch.Tensor:
    """γ·a/‖a‖ + b/‖b‖ with Frobenius norms over the whole batch tensor; a zero part adds 0."""
    def unit(g: torch.Tensor) -> torch.Tensor:
        norm = torch.linalg.vector_norm(g)
        return g / norm if norm > 0 else torch.zeros_like(g)

    return gamma * unit(gan_gradient) + unit(ce_gradient)


def soft_labels(labels: torch.Tensor, delta: float, gen: torch.Generator) -> torch.Tensor:
    """Ỹ = 0.5 + u for Y = 1, 0.5 − u for Y = 0, u ~ U(0, Δ) per row."""
    u = torch.rand(labels.shape, generator=gen).to(labels.device) * delta  # drawn on the CPU
    return 0.5 + (2.0 * labels.to(torch.float32) - 1.0) * u


@OBJECTIVES.register("gafm")
class GAFM(Objective):
    name = "gafm"
    Params = GAFMParams
    params: GAFMParams

    @classmethod
    def check(cls, cfg: ExperimentConfig, num_classes: int | None = None) -> None:
        if num_classes is not None and num_classes != 2:  # first: no other setting can help
            raise ConfigError(not_binary(cfg.dataset.name, num_classes))
        check_setup(cfg)

    def __init__(self, params: GAFMParams, setup: ObjectiveSetup) -> None:
        super().__init__(params, setup)
        cfg = setup.cfg
        if setup.num_classes != 2:
            raise ConfigError(not_binary(cfg.dataset.name, setup.num_classes))
        shapes = set(setup.activation_shapes)
        if len(shapes) != 1:
            raise ConfigError(f"objective gafm sums the parties' outputs: they must have one shape, "
                              f"got {setup.activation_shapes}")
        self.sigma, self.delta, self.gamma = params.resolved()
        width = int(np.prod(next(iter(shapes))))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(setup.seed, "gafm", "generator"))
            self.generator = generator_network(width, params.generator_hidden)
            torch.manual_seed(derive_seed(setup.seed, "gafm", "critic"))
            self.critic = critic_network(params.critic_hidden)
            self._clip_critic()
        self.generator.to(setup.device)
        self.critic.to(setup.device)
        lr = cfg.optimizer_for("label").lr
        self.generator_optimizer = torch.optim.Adam(self.generator.parameters(),
                                                    lr=params.generator_lr or lr)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=params.critic_lr or lr)
        self.noise = generator(setup.seed, "gafm", "noise")  # ε and u, step after step
        self.orientation_statistic = 0.0  # EMA of mean(Ŷ | Y=1) − mean(Ŷ | Y=0) on train batches
        self.orientation_changes = 0

    def _clip_critic(self) -> None:
        with torch.no_grad():
            for p in self.critic.parameters():
                p.clamp_(-self.params.clip, self.params.clip)

    def aggregate(self, activations: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(list(activations))
        return stacked.sum(0) if self.params.aggregation == "sum" else stacked.mean(0)

    def critic_step(self, f: torch.Tensor, real: torch.Tensor) -> float:
        """One ascent step on L_GAN for the critic, then the weight clipping; returns L_GAN."""
        with torch.no_grad():
            fake = self.generator(f)
        value = self.critic(real).mean() - self.critic(fake).mean()
        self.critic_optimizer.zero_grad(set_to_none=True)
        (-value).backward()
        self.critic_optimizer.step()
        self._clip_critic()
        return float(value.detach())

    def generator_step(self, f: torch.Tensor) -> None:
        """One descent step on L_GAN for the generator (E[D(Y + ε)] does not depend on it)."""
        loss = -self.critic(self.generator(f)).mean()
        grads = torch.autograd.grad(loss, list(self.generator.parameters()))
        self.generator_optimizer.zero_grad(set_to_none=True)
        for p, g in zip(self.generator.parameters(), grads, strict=True):
            p.grad = g
        self.generator_optimizer.step()

    def cut_gradients(self, activations: list[torch.Tensor], own: Own, sample_ids: np.ndarray,
                      labels: torch.Tensor, class_gradients: bool = False) -> StepResult:
        """G and D are updated first: the cut gradients are computed with the updated ones,
        so nothing is left for `update`."""
        self.generator.train()
        self.critic.train()
        aggregated = self.aggregate(activations)
        f = aggregated.detach().reshape(aggregated.shape[0], -1).requires_grad_(True)
        y = labels.to(torch.float32)[:, None]
        real = y + self.sigma * torch.randn(y.shape, generator=self.noise).to(y.device)
        critic_value = 0.0
        for _ in range(self.params.critic_steps):
            critic_value = self.critic_step(f.detach(), real)
        self.generator_step(f.detach())
        # The gradients at f(X), with the updated G and D (step 3 of Algorithm A.1).
        prediction = self.generator(f)
        loss_gan = self.critic(real).mean() - self.critic(prediction).mean()
        self._track_orientation(prediction.detach()[:, 0], labels)
        (gan_gradient,) = torch.autograd.grad(loss_gan, f)
        targets = soft_labels(labels, self.delta, self.noise)
        loss_ce = F.binary_cross_entropy_with_logits(f.sum(1), targets)
        (ce_gradient,) = torch.autograd.grad(loss_ce, f)
        combined = normalised_sum(gan_gradient, ce_gradient, self.gamma)
        aggregated.backward(combined.reshape(aggregated.shape))
        metrics = {"gafm.critic_value": critic_value, "gafm.orientation": self.orientation,
                   "gafm.loss_gan": float(loss_gan.detach()),
                   "gafm.loss_ce": float(loss_ce.detach()),
                   "gafm.grad_norm_gan": float(torch.linalg.vector_norm(gan_gradient)),
                   "gafm.grad_norm_ce": float(torch.linalg.vector_norm(ce_gradient))}
        loss = self.gamma * float(loss_gan.detach()) + float(loss_ce.detach())
        return StepResult(loss, activation_gradients(activations), metrics)

    @property
    def orientation(self) -> int:
        """+1: Ŷ increases with Y on the training batches; −1: it decreases (see module doc)."""
        if self.params.orientation == "as_is":
            return 1
        return -1 if self.orientation_statistic < 0 else 1

    def _track_orientation(self, prediction: torch.Tensor, labels: torch.Tensor) -> None:
        positive = labels == 1
        if positive.all() or not positive.any():
            return
        before = self.orientation
        gap = float(prediction[positive].mean() - prediction[~positive].mean())
        decay = self.params.orientation_decay
        self.orientation_statistic = decay * self.orientation_statistic + (1 - decay) * gap
        self.orientation_changes += int(self.orientation != before)

    @torch.no_grad()
    def predict(self, activations: list[torch.Tensor], own: Own) -> torch.Tensor:
        """logit(Ŷ), [B, 1]: the generator's output before its sigmoid (exact, never saturated),
        negated while the training batches say Ŷ decreases with Y (orientation = "train")."""
        self.generator.eval()
        f = self.aggregate(activations)
        return self.orientation * self.generator[:-1](f.reshape(f.shape[0], -1))

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.state_dict(), "critic": self.critic.state_dict(),
                "generator_optimizer": self.generator_optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(),
                "noise": self.noise.get_state(),
                "orientation_statistic": self.orientation_statistic,
                "orientation_changes": self.orientation_changes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.critic.load_state_dict(state["critic"])
        self.generator_optimizer.load_state_dict(state["generator_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.noise.set_state(state["noise"])
        self.orientation_statistic = float(state["orientation_statistic"])
        self.orientation_changes = int(state["orientation_changes"])

    def summary(self) -> dict[str, Any]:
        p = self.params
        return {"sigma": self.sigma, "delta": self.delta, "gamma": self.gamma,
                "preset": p.preset, "clip": p.clip, "aggregation": p.aggregation,
                "generator_hidden": p.generator_hidden, "critic_hidden": p.critic_hidden,
                "generator_lr": p.generator_lr or self.setup.cfg.optimizer_for("label").lr,
                "critic_lr": p.critic_lr or self.setup.cfg.optimizer_for("label").lr,
                "critic_steps": p.critic_steps, "optimizer": "adam (generator and critic)",
                "orientation_mode": p.orientation, "orientation": self.orientation,
                "orientation_statistic": self.orientation_statistic,
                "orientation_changes": self.orientation_changes,
                "utility": "test AUC of the generator output", "seed": self.setup.seed}
