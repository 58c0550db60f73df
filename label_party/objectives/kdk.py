"""KD^k (Arazzi et al.): a teacher on the label party's own features, k-anonymous soft labels.

Before VFL training the label party trains a teacher with plain cross-entropy on its own feature
slice (`features.label_party`), train rows only. Each train row's soft label (`soft_labels`):
- "true_class" (default, project choice, ALGORITHMS.md §4.3): the true class, which the label
  party knows, gets 1 − ε and the k − 1 other classes the teacher finds most probable ε/(k − 1)
  each, 0 elsewhere; when the true class is among the teacher's top k, the k − 1 others are the
  next most probable classes excluding it, so every vector sums to 1 with exactly k non-zero
  entries;
- "arazzi" (the paper's eq. (9) and Algorithm 1): the teacher's most probable class gets 1 − ε
  and its next k − 1 classes ε/(k − 1) each, whatever the true class.
VFL training is then soft-target cross-entropy against these vectors (`target = "soft_labels"`,
the default), or against their softmax (`target = "softmax"`: CE(SM(preds), SM(SL)), the
paper's eq. (10) as written).

Binary datasets: with `training.loss = "ce"` (two logits) the vectors are used as they are; with
BCE (one logit, the default for two classes) k must be 2 and the target is the soft label's
probability of class 1, i.e. 1 − ε for a positive and ε for a negative row (label smoothing).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, PositiveInt
from torch import nn
from torch.nn import functional as F

from label_party.objectives.base import OBJECTIVES, ObjectiveParams, ObjectiveSetup
from label_party.objectives.cross_entropy import CrossEntropy
from splitleak.config import ConfigError, ExperimentConfig, OptimizerConfig
from splitleak.inputs import PartyInputs
from splitleak.models import build_bottom
from splitleak.optim import make_optimizer
from splitleak.seeding import derive_seed, generator
from splitleak.settings import MAX_EPOCHS, MAX_RATE


class KDkParams(ObjectiveParams):
    k: int = Field(3, ge=2)  # classes sharing the label mass (paper: 3; Criteo 2)
    epsilon: float = Field(0.45, gt=0.0, lt=1.0)  # mass moved off the true class (paper: 0.45)
    teacher_epochs: int = Field(20, gt=0, le=MAX_EPOCHS)  # reference: 20
    teacher_optimizer: Literal["adam", "sgd", "adagrad"] = "adam"  # reference: Adam
    teacher_lr: float = Field(1e-4, gt=0.0, le=MAX_RATE)  # reference: 1e-4
    teacher_batch_size: PositiveInt | None = None  # None: training.batch_size
    # Who gets 1 − ε: "true_class" (ours) or "arazzi" (the teacher's top class, eq. (9)).
    soft_labels: Literal["true_class", "arazzi"] = "true_class"
    # What VFL training's cross-entropy is against: the soft labels themselves (ours) or their
    # softmax ("softmax", eq. (10) as written: CE(SM(preds), SM(SL))).
    target: Literal["soft_labels", "softmax"] = "soft_labels"


def too_many_classes(k: int, num_classes: int, dataset: str) -> str:
    return (f"objective.k = {k} exceeds the {num_classes} classes of {dataset}; allowed: "
            f"2..{num_classes}")


def check_setup(cfg: ExperimentConfig) -> None:
    """KD^k's teacher needs the label party's own columns."""
    if cfg.features.label_party is None:
        raise ConfigError("objective kdk trains its teacher on the label party's own features: "
                          "give features.label_party = [start, stop] (it may overlap the passive "
                          "parties' columns)")


def kdk_soft_labels(teacher_probs: torch.Tensor, labels: torch.Tensor, k: int,
                    epsilon: float, rule: str = "true_class") -> torch.Tensor:
    """[B, K] soft labels. rule "true_class": 1 − ε on the true class, ε/(k − 1) on the k − 1
    most probable others; "arazzi" (eq. (9)): 1 − ε on the teacher's most probable class,
    ε/(k − 1) on its next k − 1 (`labels` unused)."""
    num_classes = teacher_probs.shape[1]
    if not 2 <= k <= num_classes:
        raise ValueError(f"k = {k} must be in 2..{num_classes} (the number of classes)")
    if rule == "arazzi":
        labels = teacher_probs.to(torch.float64).argmax(dim=1)
    elif rule != "true_class":
        raise ValueError(f"rule = {rule!r}; allowed: 'true_class', 'arazzi'")
    labels = labels.to(torch.int64)
    masked = teacher_probs.to(torch.float64).clone()
    masked.scatter_(1, labels[:, None], -torch.inf)  # the true class is never one of the others
    others = masked.topk(k - 1, dim=1).indices
    soft = torch.zeros(teacher_probs.shape, dtype=torch.float32)
    soft.scatter_(1, others, epsilon / (k - 1))
    soft.scatter_(1, labels[:, None], 1.0 - epsilon)
    return soft


def _teacher_model(cfg: ExperimentConfig, own: PartyInputs, num_classes: int, seed: int) -> nn.Module:
    """The configured model family run to the end on the label party's slice, K logits out."""
    depth = len(cfg.model.channels) if cfg.model.kind == "cnn" else len(cfg.model.layers)
    full = cfg.model.model_copy(update={"top": "none", "aggregation": "sum", "cut_layer": depth})
    return build_bottom(full, own.spec, num_classes, seed)


def train_teacher(cfg: ExperimentConfig, own: PartyInputs, labels: np.ndarray, train_ids: np.ndarray,
                  num_classes: int, params: KDkParams, seed: int) -> tuple[nn.Module, list[float]]:
    """Plain CE on the train rows of the label party's own columns; returns the model and the
    mean loss of each epoch."""
    model = _teacher_model(cfg, own, num_classes, derive_seed(seed, "kdk", "teacher")).to(own.device)
    optimizer = make_optimizer(model.parameters(),
                               OptimizerConfig(name=params.teacher_optimizer, lr=params.teacher_lr))
    batch_size = params.teacher_batch_size or cfg.training.batch_size
    ids = torch.from_numpy(np.asarray(train_ids, dtype=np.int64))
    y_all = torch.from_numpy(np.asarray(labels, dtype=np.int64)).to(own.device)
    shuffle = generator(seed, "kdk", "teacher_order")
    losses = []
    model.train()
    for _ in range(params.teacher_epochs):
        order = ids[torch.randperm(ids.numel(), generator=shuffle)]
        total = 0.0
        for start in range(0, order.numel(), batch_size):
            rows = order[start: start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(*own.rows(rows)), y_all[rows.to(own.device)])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * rows.numel()
        losses.append(total / max(1, order.numel()))
    model.eval()
    return model, losses


@torch.no_grad()
def teacher_probabilities(model: nn.Module, own: PartyInputs, ids: np.ndarray,
                          chunk: int = 4096) -> torch.Tensor:
    rows = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    parts = [F.softmax(model(*own.rows(rows[i: i + chunk])), dim=1).cpu()
             for i in range(0, rows.numel(), chunk)]
    return torch.cat(parts) if parts else torch.zeros(0, 0)


@OBJECTIVES.register("kdk")
class KDk(CrossEntropy):
    """Cross-entropy against the teacher-built k-anonymous soft labels of each train row."""

    name = "kdk"
    Params = KDkParams
    params: KDkParams

    @classmethod
    def check(cls, cfg: ExperimentConfig, num_classes: int | None = None) -> None:
        check_setup(cfg)
        k = cls.Params.model_validate(cfg.objective.params).k
        if num_classes is not None and k > num_classes:
            raise ConfigError(too_many_classes(k, num_classes, cfg.dataset.name))

    def __init__(self, params: KDkParams, setup: ObjectiveSetup) -> None:
        if setup.own_inputs is None:
            raise ConfigError("objective kdk: the label party has no own features "
                              "(features.label_party) to train its teacher on")
        super().__init__(params, setup)
        k_classes = setup.num_classes
        if params.k > k_classes:
            raise ConfigError(too_many_classes(params.k, k_classes, setup.cfg.dataset.name))
        train = np.asarray(setup.train_ids, dtype=np.int64)
        labels = np.asarray(setup.labels, dtype=np.int64)
        teacher, self.teacher_losses = train_teacher(setup.cfg, setup.own_inputs, labels, train,
                                                     k_classes, params, setup.seed)
        probs = teacher_probabilities(teacher, setup.own_inputs, np.arange(labels.size))
        y = torch.from_numpy(labels)
        self.teacher_figures = _teacher_figures(probs, y, train, params.k)
        soft = torch.zeros(labels.size, k_classes)
        soft[train] = kdk_soft_labels(probs[train], y[train], params.k, params.epsilon,
                                        params.soft_labels)
        if params.target == "softmax":
            soft[train] = torch.softmax(soft[train], dim=1)
        # BCE: one logit, so the target is the probability of class 1.
        soft = soft[:, 1].contiguous() if self.loss_kind == "bce" else soft
        self.soft_targets = soft.to(setup.device)

    def targets(self, sample_ids: np.ndarray, labels: torch.Tensor) -> torch.Tensor:
        return self.soft_targets[self.rows(sample_ids)]

    def state_dict(self) -> dict[str, Any]:
        # The teacher is retrained identically from the seed; its soft labels are kept so a
        # resumed run provably learns from the same targets.
        return {**super().state_dict(), "soft_targets": self.soft_targets.cpu()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if not torch.equal(state["soft_targets"].cpu(), self.soft_targets.cpu()):
            raise ValueError("objective kdk: the checkpoint's soft labels differ from the ones "
                             "this teacher gives (a different dataset or config?)")

    def summary(self) -> dict[str, Any]:
        p = self.params
        softmax = "softmax of the " if p.target == "softmax" else ""
        return {"k": p.k, "epsilon": p.epsilon, "soft_labels": p.soft_labels,
                "teacher_epochs": p.teacher_epochs,
                "teacher_optimizer": p.teacher_optimizer, "teacher_lr": p.teacher_lr,
                "teacher_batch_size": p.teacher_batch_size or self.setup.cfg.training.batch_size,
                "teacher_features": list(self.setup.cfg.features.label_party or ()),
                "teacher_final_loss": self.teacher_losses[-1] if self.teacher_losses else None,
                **self.teacher_figures,
                "target": f"P(class 1) of the {softmax}soft label (BCE)" if self.loss_kind == "bce"
                else f"{softmax}soft-label vector (soft-target CE)",
                "seed": self.setup.seed}


def _teacher_figures(probs: torch.Tensor, labels: torch.Tensor, train: np.ndarray,
                     k: int) -> dict[str, float | None]:
    """Teacher top-1 accuracy on train and held-out rows, and how often the truth is in its top k."""
    held_out = np.setdiff1d(np.arange(labels.numel()), train)

    def accuracy(rows: np.ndarray) -> float | None:
        if rows.size == 0:
            return None
        return float((probs[rows].argmax(1) == labels[rows]).double().mean())

    in_top_k = (probs[train].topk(k, dim=1).indices == labels[train][:, None]).any(1)
    return {"teacher_train_accuracy": accuracy(train),
            "teacher_heldout_accuracy": accuracy(held_out),
            "true_class_in_teacher_top_k": float(in_top_k.double().mean()) if train.size else None}
