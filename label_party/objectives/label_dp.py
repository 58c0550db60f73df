"""Label DP by randomized response (Qiu et al.): every training label flipped once per run.

Binary: a label is replaced by the other one with probability p = 1/(e^ε + 1). K classes: it is
kept with probability e^ε/(e^ε + K − 1) and otherwise replaced by one of the K − 1 other labels,
uniformly (so each other label has probability 1/(e^ε + K − 1); K = 2 gives the binary rule).
The perturbed labels are drawn once, from `splitleak.seeding.rng(seed, "label_dp")`, for every
row; only train rows are ever used (test metrics are computed against the true labels).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from pydantic import Field, model_validator

from label_party.objectives.base import OBJECTIVES, ObjectiveParams, ObjectiveSetup
from label_party.objectives.cross_entropy import CrossEntropy
from splitleak.config import ConfigError, ExperimentConfig
from splitleak.seeding import rng


class LabelDPParams(ObjectiveParams):
    """Give ε, or the flip probability p (then ε is derived from p and the class count)."""

    epsilon: float | None = Field(None, ge=0.0)
    flip_probability: float | None = Field(None, gt=0.0, lt=1.0)

    @model_validator(mode="after")
    def _one_of(self) -> LabelDPParams:
        if (self.epsilon is None) == (self.flip_probability is None):
            raise ValueError("give exactly one of epsilon or flip_probability")
        return self


def flip_probability(epsilon: float, num_classes: int) -> float:
    """P(label replaced) = (K − 1)/(e^ε + K − 1); binary: 1/(e^ε + 1)."""
    others = num_classes - 1
    if epsilon > 700:  # e^ε overflows; the label is kept with probability 1 - 1e-304
        return 0.0
    return others / (math.exp(epsilon) + others)


def too_likely(flip: float, num_classes: int, dataset: str) -> str | None:
    """Why `flip` cannot be a randomized-response flip probability for K classes (ε would be
    negative), or None when it can."""
    most = (num_classes - 1) / num_classes
    if flip <= most:
        return None
    return (f"objective.flip_probability = {flip} exceeds (K − 1)/K = {most:.6g} for the "
            f"{num_classes} classes of {dataset} (randomized response needs ε ≥ 0); allowed: "
            f"0 < flip_probability ≤ {most:.6g}")


def epsilon_for(flip: float, num_classes: int) -> float:
    """The inverse of `flip_probability`: ε = ln((1 − p)(K − 1)/p)."""
    epsilon = math.log((1.0 - flip) * (num_classes - 1) / flip)
    if epsilon < 0:
        raise ValueError(f"flip_probability {flip} exceeds (K-1)/K = {(num_classes - 1) / num_classes}"
                         f" for K = {num_classes}: randomized response needs ε >= 0")
    return epsilon


def randomized_response(labels: np.ndarray, num_classes: int, flip: float,
                        generator: np.random.Generator) -> np.ndarray:
    """Each label replaced with probability `flip` by a uniformly drawn different label."""
    labels = np.asarray(labels, dtype=np.int64)
    flipped = generator.random(labels.shape) < flip
    # An offset in 1..K-1 added modulo K is a uniform draw among the K - 1 other labels.
    offset = generator.integers(1, num_classes, size=labels.shape) if num_classes > 1 else 0
    return np.where(flipped, (labels + offset) % num_classes, labels)


@OBJECTIVES.register("label_dp")
class LabelDP(CrossEntropy):
    """Plain supervised training against labels perturbed once by randomized response."""

    name = "label_dp"
    Params = LabelDPParams
    params: LabelDPParams

    @classmethod
    def check(cls, cfg: ExperimentConfig, num_classes: int | None = None) -> None:
        if num_classes is None:  # the dataset's classes are not known yet: the run checks
            return
        flip = cls.Params.model_validate(cfg.objective.params).flip_probability
        if flip is not None:
            problem = too_likely(flip, num_classes, cfg.dataset.name)
            if problem:
                raise ConfigError(problem)

    def __init__(self, params: LabelDPParams, setup: ObjectiveSetup) -> None:
        super().__init__(params, setup)
        k = setup.num_classes
        if params.epsilon is not None:
            self.epsilon = float(params.epsilon)
            self.flip = flip_probability(self.epsilon, k)
        else:
            self.flip = float(params.flip_probability)  # type: ignore[arg-type]
            problem = too_likely(self.flip, k, setup.cfg.dataset.name)
            if problem:
                raise ConfigError(problem)
            self.epsilon = epsilon_for(self.flip, k)
        noisy = randomized_response(setup.labels, k, self.flip, rng(setup.seed, "label_dp"))
        self.noisy_labels = torch.from_numpy(noisy).to(setup.device)
        train = np.asarray(setup.train_ids, dtype=np.int64)
        changed = noisy[train] != np.asarray(setup.labels)[train]
        self.realised_flip_rate = float(changed.mean()) if train.size else 0.0

    def targets(self, sample_ids: np.ndarray, labels: torch.Tensor) -> torch.Tensor:
        return self.noisy_labels[self.rows(sample_ids)]

    def summary(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "flip_probability": self.flip,
                "realised_flip_rate": self.realised_flip_rate,
                "train_rows": int(len(self.setup.train_ids)), "num_classes": self.setup.num_classes,
                "mechanism": "randomized response, labels perturbed once per run",
                "seed": self.setup.seed}
