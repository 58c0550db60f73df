"""CAE (VFLAIR; Liu et al.'s confusional autoencoder): train on confused soft labels, decode back.

Before VFL training the label party trains an encoder E and a decoder D (each K → hidden →
ReLU → K → softmax) on label vectors y, minimising

    L_CAE = w_rec · CE(y, D(E(y))) − w_conf · CE(y, E(y)) − λ · H(E(y)),

H = entropy Σ −q log q, batch means: D must recover the label (reconstruction), E's soft label
moves its mass off the true class (confusion) and spreads it (λ, the confusion strength).
CE(y, q) is computed as both reference implementations compute it, on the probability vector q
taken as logits: −Σ y · log_softmax(q). That bounds each term (a true CE on probabilities lets
−CE(y, E(y)) fall without limit and the optimiser map two classes onto one, which D can then
not tell apart: measured, 1 to 4 of 10 classes lost). Training rows are near-one-hot vectors
sharpen(softmax(u), T) = softmax(u/T), u ~ U[0, 1]^K, T = 0.025 (both references), so one-hot
labels are in distribution; weights start N(0, 0.01), biases 0 (VFLAIR's initialisation; with
PyTorch's default one of two binary seeds kept the true class on top).

VFL then trains with soft-target cross-entropy against E(one-hot(y)) (BCE, one logit: against
E(·)'s class-1 probability), so the gradients the parties receive follow the confused labels;
predictions go through the decoder: softmax(logits) (BCE: [1 − σ, σ]) → D → the class
probabilities, returned as D's pre-softmax logits (BCE: their difference, log q₁/q₀).

Choices: λ's sign follows SecretFlow's CoAE (larger λ = higher-entropy soft labels; VFLAIR's
training script adds +λ·H); the hidden width defaults to 6K + 2 (the references square it:
(6K + 2)² units, the same soft labels on these K-dimensional inputs at 15× the start-up time);
w_rec = 10, w_conf = 1, Adam 5e-4, batch 128, 30 000 rows as both references; the number of
epochs is a parameter (VFLAIR: 30 to 75 by K). Everything is seeded from the run seed. Per-class
gradients (GradPerturb) use E(one-hot(c)) as the label-c target.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import ConfigDict, Field, PositiveFloat
from torch import nn
from torch.nn import functional as F

from label_party.objectives.base import OBJECTIVES, ObjectiveParams, ObjectiveSetup, Own
from label_party.objectives.cross_entropy import CrossEntropy, load_top_state
from splitleak.config import ConfigError, ExperimentConfig
from splitleak.seeding import derive_seed, generator
from splitleak.settings import MAX_BATCH, MAX_EPOCHS, MAX_RATE, MAX_ROWS, MAX_SCALE, MAX_WIDTH


class CAEParams(ObjectiveParams):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    confusion: float = Field(alias="lambda", ge=0.0, le=MAX_SCALE)  # λ: weight of the soft labels' entropy
    reconstruction_weight: float = Field(10.0, gt=0.0, le=MAX_SCALE)  # w_rec
    confusion_weight: float = Field(1.0, ge=0.0, le=MAX_SCALE)  # w_conf
    hidden: int | None = Field(None, gt=0, le=MAX_WIDTH)  # None: 6K + 2
    epochs: int = Field(30, gt=0, le=MAX_EPOCHS)
    rows: int = Field(30000, gt=0, le=MAX_ROWS)  # random training vectors
    batch_size: int = Field(128, gt=0, le=MAX_BATCH)
    lr: float = Field(5e-4, gt=0.0, le=MAX_RATE)
    temperature: PositiveFloat = 0.025  # T of the sharpened training vectors


# Memory the autoencoder's training may take: its random label vectors (rows × K floats, three
# times while they are drawn and sharpened, and each epoch's row order), and one batch's
# hidden activations with their gradients. Far above the references' 30,000 rows (a few MiB).
MEMORY_BYTES = 2 << 30


def row_bytes(classes: int) -> int:
    """Bytes per random training vector at the peak of drawing them (see MEMORY_BYTES)."""
    return 12 * classes + 16


def memory_problem(params: CAEParams, classes: int) -> str | None:
    """Why training the autoencoder would exceed MEMORY_BYTES (naming the field), or None."""
    gib = MEMORY_BYTES / (1 << 30)
    need = params.rows * row_bytes(classes)
    if need > MEMORY_BYTES:
        most = MEMORY_BYTES // row_bytes(classes)
        return (f"objective.rows = {params.rows:,} random label vectors of {classes} classes take "
                f"{need / (1 << 30):.1f} GiB while the autoencoder trains, over the {gib:g} GiB "
                f"allowed: give at most {most:,} rows ({classes} classes; the references use 30,000)")
    hidden = params.hidden or 6 * classes + 2
    batch = min(params.batch_size, params.rows)
    need = 32 * batch * hidden  # 4 hidden layers' float32 outputs and their gradients
    if need > MEMORY_BYTES:
        return (f"objective.batch_size = {batch:,} rows × objective.hidden = {hidden:,} units "
                f"take {need / (1 << 30):.1f} GiB of activations per autoencoder batch, over the "
                f"{gib:g} GiB allowed: give a product of at most {MEMORY_BYTES // 32:,} "
                "(the references: 128 × 6K + 2)")
    return None


class ConfusionalAutoencoder(nn.Module):
    """E: label vector → soft label; D: soft label (or prediction) → class logits."""

    def __init__(self, classes: int, hidden: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(classes, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        self.decoder = nn.Sequential(nn.Linear(classes, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        for layer in (*self.encoder, *self.decoder):
            if isinstance(layer, nn.Linear):  # VFLAIR's start: near-uniform soft labels
                nn.init.normal_(layer.weight, std=0.01)
                nn.init.zeros_(layer.bias)

    def encode(self, labels: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.encoder(labels), dim=1)

    def forward(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(soft label E(y), decoder logits of D(E(y)))."""
        soft = self.encode(labels)
        return soft, self.decoder(soft)


def reference_ce(labels: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """The references' CE: the probabilities taken as logits, −Σ y·log_softmax(q), batch mean."""
    return -(labels * F.log_softmax(probs, dim=1)).sum(1).mean()


def cae_loss(model: ConfusionalAutoencoder, labels: torch.Tensor, params: CAEParams) -> torch.Tensor:
    soft, decoded = model(labels)
    reconstruction = reference_ce(labels, F.softmax(decoded, dim=1))
    entropy = -(soft * torch.log(soft.clamp_min(1e-12))).sum(1).mean()
    return (params.reconstruction_weight * reconstruction
            - params.confusion_weight * reference_ce(labels, soft) - params.confusion * entropy)


def train_autoencoder(classes: int, params: CAEParams, seed: int) -> tuple[ConfusionalAutoencoder,
                                                                         list[float]]:
    """Train E and D on seeded near-one-hot vectors; returns the model and each epoch's loss.

    One intra-op thread, whatever the process uses: on K-wide layers threads cost more than they
    save (measured 8× the CPU time with 2 threads on a busy machine), and the trained
    autoencoder is then the same bit for bit whatever `run.torch_threads` says."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(classes, params, seed)
    finally:
        torch.set_num_threads(threads)


def _train(classes: int, params: CAEParams, seed: int) -> tuple[ConfusionalAutoencoder, list[float]]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "cae", "autoencoder"))
        model = ConfusionalAutoencoder(classes, params.hidden or 6 * classes + 2)
    data = generator(seed, "cae", "data")
    # sharpen(softmax(u), T) = softmax(u)^(1/T) renormalised = softmax(u/T), without underflow.
    vectors = F.softmax(torch.rand(params.rows, classes, generator=data) / params.temperature, dim=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=params.lr)
    losses = []
    for _ in range(params.epochs):
        order = torch.randperm(params.rows, generator=data)
        total = 0.0
        for start in range(0, params.rows, params.batch_size):
            batch = vectors[order[start: start + params.batch_size]]
            optimizer.zero_grad(set_to_none=True)
            loss = cae_loss(model, batch, params)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * batch.shape[0]
        losses.append(total / params.rows)
    model.eval()
    return model, losses


@OBJECTIVES.register("cae")
class CAE(CrossEntropy):
    """Soft-target cross-entropy against E(one-hot(y)); predictions decoded by D."""

    name = "cae"
    Params = CAEParams
    params: CAEParams

    @classmethod
    def check(cls, cfg: ExperimentConfig, num_classes: int | None = None) -> None:
        """Bounded memory: refuse `rows` (and `batch_size` × `hidden`) beyond MEMORY_BYTES, once
        the dataset's classes are known (`__init__` checks its own parameters again)."""
        if num_classes is None:
            return
        problem = memory_problem(cls.Params.model_validate(cfg.objective.params), num_classes)
        if problem:
            raise ConfigError(problem)

    def __init__(self, params: CAEParams, setup: ObjectiveSetup) -> None:
        super().__init__(params, setup)
        classes = setup.num_classes
        problem = memory_problem(params, classes)
        if problem:
            raise ConfigError(problem)
        autoencoder, self.losses = train_autoencoder(classes, params, setup.seed)
        self.autoencoder = autoencoder.to(setup.device)  # trained on the CPU (K-wide layers)
        for p in self.autoencoder.parameters():
            p.requires_grad_(False)  # fixed during VFL: only the top model trains
        self.soft_labels = self._encoded_one_hots(classes)  # row c = E(e_c)

    @torch.no_grad()
    def _encoded_one_hots(self, classes: int) -> torch.Tensor:
        return self.autoencoder.encode(torch.eye(classes, device=self.setup.device))

    def _as_target(self, soft: torch.Tensor) -> torch.Tensor:
        # BCE: one logit, so the target is the soft label's probability of class 1.
        return soft[..., 1].contiguous() if self.loss_kind == "bce" else soft

    def targets(self, sample_ids: np.ndarray, labels: torch.Tensor) -> torch.Tensor:
        return self._as_target(self.soft_labels[labels])

    def class_targets(self, batch_size: int) -> torch.Tensor:
        classes = self.soft_labels.shape[0]
        return self._as_target(self.soft_labels[:, None, :].expand(classes, batch_size, classes))

    def predict(self, activations: list[torch.Tensor], own: Own) -> torch.Tensor:
        logits = self.logits(activations, own, training=False)
        if self.loss_kind == "bce":
            p = torch.sigmoid(logits[:, 0])
            decoded = self.autoencoder.decoder(torch.stack([1.0 - p, p], dim=1))
            return (decoded[:, 1] - decoded[:, 0])[:, None]  # log(q₁/q₀)
        return self.autoencoder.decoder(F.softmax(logits, dim=1))

    def summary(self) -> dict[str, Any]:
        p = self.params
        with torch.no_grad():
            decoded = self.autoencoder.decoder(self.soft_labels).argmax(1)
        classes = torch.arange(self.soft_labels.shape[0], device=self.soft_labels.device)
        soft = self.soft_labels
        return {"lambda": p.confusion, "reconstruction_weight": p.reconstruction_weight,
                "confusion_weight": p.confusion_weight,
                "hidden": self.autoencoder.encoder[0].out_features, "epochs": p.epochs,
                "rows": p.rows, "batch_size": p.batch_size, "lr": p.lr,
                "temperature": p.temperature, "final_loss": self.losses[-1],
                "decoded_one_hot_accuracy": float((decoded == classes).double().mean()),
                "soft_label_true_class_mass": float(soft[classes, classes].mean()),
                "soft_label_argmax_is_true": float((soft.argmax(1) == classes).double().mean()),
                "soft_label_entropy": float(-(soft * soft.clamp_min(1e-12).log()).sum(1).mean()),
                "seed": self.setup.seed}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "autoencoder": self.autoencoder.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.autoencoder.load_state_dict(state["autoencoder"])
        self.soft_labels = self._encoded_one_hots(self.soft_labels.shape[0])
        load_top_state(self, state)
