"""Model completion (Fu et al.): a head on the attacker's trained bottom model(s), trained with
MixMatch on a few labelled rows and the party's other rows, scored on train and test rows."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from attacker.attacks.completion.mixmatch import (
    debiased,
    ema_update,
    jitter,
    linear_rampup,
    mixup,
    mixup_weight,
    semi_supervised_loss,
    sharpen,
    shift_images,
)
from splitleak.artifacts.paths import RunDir
from splitleak.config import ExperimentConfig
from splitleak.datasets import build_dataset
from splitleak.inputs import PartyInputs, load_party_inputs
from splitleak.models import Bottom, build_bottom
from splitleak.partition import passive_columns
from splitleak.seeding import derive_seed, generator, rng

EVAL_CHUNK = 1024


@dataclass(frozen=True)
class Settings:
    """The training recipe (MixMatch's and Fu et al.'s values by default; see the plug-in)."""

    steps: int
    batch_size: int
    lr: float
    augmentations: int  # K
    temperature: float  # T
    alpha: float  # Beta(α, α)
    lambda_u: float
    rampup: float  # fraction of the steps over which λ_u ramps up linearly
    ema_decay: float
    weight_decay: float  # MixMatch's per-step θ ← θ·(1 − wd·lr)
    head_layers: int
    fine_tune_bottom: bool
    max_shift: float  # images: random translation up to this fraction of the height (whole pixels)
    noise: float  # tabular: Gaussian noise on standardised numeric fields


Part = tuple[torch.Tensor, torch.Tensor]  # (numeric or images, categorical) of one party


class CompletionModel(nn.Module):
    """The bottoms of the attacking parties, their outputs flattened and concatenated, then a head
    of Fu et al.'s shape: (BatchNorm → ReLU → Linear) × head_layers, the last one to the classes."""

    def __init__(self, bottoms: list[Bottom], width: int, num_classes: int, head_layers: int) -> None:
        super().__init__()
        self.bottoms = nn.ModuleList(bottoms)
        layers: list[nn.Module] = []
        for i in range(head_layers):
            out = num_classes if i == head_layers - 1 else width
            layers += [nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, out)]
        self.head = nn.Sequential(*layers)

    @property
    def _bottoms(self) -> Sequence[Bottom]:
        return cast("Sequence[Bottom]", self.bottoms)  # a ModuleList of Bottoms

    def encode(self, parts: list[Part]) -> list[torch.Tensor]:
        """Each party's input as a float tensor: categorical ids go through the bottom's field
        encoder, so rows can be mixed (ids cannot be interpolated)."""
        return [b.encoder(n, c) if b.encoder is not None else n
                for b, (n, c) in zip(self._bottoms, parts, strict=True)]

    def forward_encoded(self, encoded: list[torch.Tensor]) -> torch.Tensor:
        outputs = [b.body(e).flatten(1) for b, e in zip(self._bottoms, encoded, strict=True)]
        return self.head(torch.cat(outputs, dim=1))

    def forward(self, parts: list[Part]) -> torch.Tensor:
        return self.forward_encoded(self.encode(parts))


@dataclass
class PartyView:
    """One attacking party's columns and its trained bottom model, as it kept them."""

    party_id: int
    inputs: PartyInputs
    bottom: Bottom

    def rows(self, ids: torch.Tensor) -> Part:
        return self.inputs.rows(ids)


def load_parties(run: RunDir, cfg: ExperimentConfig, parties: tuple[int, ...],
                 num_classes: int, device: torch.device | str = "cpu") -> list[PartyView]:
    """Each party's own feature columns (loaded as the party loads them) and its saved bottom,
    both on `device`."""
    dataset = build_dataset(cfg.dataset.name, cfg.dataset.params)
    columns = passive_columns(cfg, dataset.schema())
    views = []
    for k in parties:
        path = run.bottom_model(k)
        if not path.exists():
            raise ValueError(f"model completion needs passive party {k}'s trained bottom model at "
                             f"{path}; the party saves it when training ends (did the run finish?)")
        inputs = load_party_inputs(cfg, dataset, columns[k]).to(device)
        bottom = build_bottom(cfg.model, inputs.spec, cfg.output_width(num_classes), seed=0)
        state = torch.load(path, map_location="cpu", weights_only=True)
        bottom.load_state_dict(state["model"])
        views.append(PartyView(k, inputs, bottom.to(device)))
    return views


def random_bottoms(cfg: ExperimentConfig, views: list[PartyView], num_classes: int,
                   seed: int) -> list[PartyView]:
    """The same architectures freshly initialised: the baseline with nothing learnt in training."""
    return [PartyView(v.party_id, v.inputs,
                      build_bottom(cfg.model, v.inputs.spec, cfg.output_width(num_classes),
                                   derive_seed(seed, "completion", "random_bottom", v.party_id)
                                   ).to(v.inputs.device))
            for v in views]


def build_model(views: list[PartyView], num_classes: int, settings: Settings,
                seed: int) -> CompletionModel:
    bottoms = [copy.deepcopy(v.bottom) for v in views]
    with torch.no_grad():
        probe = torch.zeros(1, dtype=torch.int64)
        width = sum(int(b(*v.rows(probe)).flatten(1).shape[1]) for b, v in zip(bottoms, views,
                                                                                 strict=True))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "completion", "head"))
        model = CompletionModel(bottoms, width, num_classes, settings.head_layers)
    model.head.to(views[0].inputs.device)
    for parameter in model.bottoms.parameters():
        parameter.requires_grad_(settings.fine_tune_bottom)
    return model


def _batches(ids: np.ndarray, size: int, shuffle: np.random.Generator) -> Iterator[np.ndarray]:
    """Endless shuffled passes over `ids` in batches of `size` (the short remainder dropped)."""
    size = min(size, ids.size)
    while True:
        order = shuffle.permutation(ids)
        for start in range(0, order.size - size + 1, size):
            yield order[start: start + size]


class Trainer:
    """Trains one CompletionModel: MixMatch, or plain cross-entropy on the labelled rows alone."""

    def __init__(self, model: CompletionModel, views: list[PartyView], num_classes: int,
                 settings: Settings, seed: int) -> None:
        self.model = model
        self.views = views
        self.device = views[0].inputs.device
        self.num_classes = num_classes
        self.s = settings
        self.ema = copy.deepcopy(model)
        for parameter in self.ema.parameters():
            parameter.requires_grad_(False)
        # zero-started running averages of every floating-point entry, debiased when read
        self._averages = {k: torch.zeros_like(v) for k, v in model.state_dict().items()
                          if v.is_floating_point()}
        self._updates = 0
        self.torch_gen = generator(seed, "completion", "augment")
        self.mix_rng = rng(seed, "completion", "mixup")
        self.order_rng = rng(seed, "completion", "order")
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(trainable, lr=settings.lr)

    def _augmented(self, ids: np.ndarray) -> list[Part]:
        rows = torch.from_numpy(ids)
        parts = []
        for view in self.views:
            numeric, categorical = view.rows(rows)
            if view.inputs.spec.image_shape is not None:
                pixels = math.floor(self.s.max_shift * numeric.shape[2])
                numeric = shift_images(numeric, pixels, self.torch_gen)
            else:
                numeric = jitter(numeric, self.s.noise, self.torch_gen)
            parts.append((numeric, categorical))
        return parts

    def fit(self, labelled: np.ndarray, labels: np.ndarray, unlabelled: np.ndarray | None) -> None:
        """`unlabelled` None: the labelled-only baseline (no guessing, no MixUp)."""
        by_id = dict(zip(labelled.tolist(), labels.tolist(), strict=True))
        labelled_batches = _batches(labelled, self.s.batch_size, self.order_rng)
        unlabelled_batches = (_batches(unlabelled, self.s.batch_size, self.order_rng)
                              if unlabelled is not None else None)
        self.model.train()
        for step in range(self.s.steps):
            x_ids = next(labelled_batches)
            targets_x = F.one_hot(torch.tensor([by_id[i] for i in x_ids.tolist()]),
                                  self.num_classes).float().to(self.device)
            if unlabelled_batches is None:
                loss = -(F.log_softmax(self.model(self._augmented(x_ids)), 1) * targets_x).sum(1).mean()
            else:
                loss = self._mixmatch_loss(x_ids, targets_x, next(unlabelled_batches), step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self._average()

    def _mixmatch_loss(self, x_ids: np.ndarray, targets_x: torch.Tensor, u_ids: np.ndarray,
                       step: int) -> torch.Tensor:
        views_u = [self._augmented(u_ids) for _ in range(self.s.augmentations)]
        with torch.no_grad():  # the label guess: mean prediction over K views, sharpened
            guess = torch.stack([F.softmax(self.model(v), 1) for v in views_u]).mean(0)
            targets_u = sharpen(guess, self.s.temperature)
        encoded = [self.model.encode(self._augmented(x_ids)), *(self.model.encode(v) for v in views_u)]
        rows = [torch.cat([e[p] for e in encoded]) for p in range(len(self.views))]
        targets = torch.cat([targets_x, *([targets_u] * self.s.augmentations)])
        lam = mixup_weight(self.mix_rng, self.s.alpha)
        permutation = torch.randperm(targets.shape[0], generator=self.torch_gen).to(self.device)
        logits = self.model.forward_encoded([mixup(r, permutation, lam) for r in rows])
        mixed_targets = mixup(targets, permutation, lam)
        n_x = targets_x.shape[0]
        loss_x, loss_u = semi_supervised_loss(logits[:n_x], mixed_targets[:n_x], logits[n_x:],
                                              mixed_targets[n_x:])
        weight = self.s.lambda_u * linear_rampup(step, self.s.rampup * self.s.steps)
        return loss_x + weight * loss_u

    def _average(self) -> None:
        """EMA of every floating-point entry (weights and BatchNorm statistics), then MixMatch's
        weight decay on the trained weights."""
        state = self.model.state_dict()
        ema_update(self._averages.values(), [state[k] for k in self._averages], self.s.ema_decay)
        self._updates += 1
        with torch.no_grad():
            for parameter in self.model.parameters():
                if parameter.requires_grad:
                    parameter.mul_(1.0 - self.s.weight_decay * self.s.lr)

    @torch.no_grad()
    def predict(self, ids: np.ndarray) -> torch.Tensor:
        """Logits of the EMA model (what the attacker keeps) for these rows."""
        if self._updates:
            self.ema.load_state_dict({k: debiased(v, self.s.ema_decay, self._updates)
                                      for k, v in self._averages.items()}, strict=False)
        self.ema.eval()
        chunks = [torch.from_numpy(ids[i: i + EVAL_CHUNK]) for i in range(0, ids.size, EVAL_CHUNK)]
        outputs = [self.ema([v.rows(c) for v in self.views]).cpu() for c in chunks]
        return torch.cat(outputs) if outputs else torch.zeros(0, self.num_classes)


def top_k_correct(logits: torch.Tensor, truth: np.ndarray, k: int) -> int:
    """Rows whose true class is among the k highest logits."""
    if logits.shape[0] == 0:
        return 0
    top = logits.topk(min(k, logits.shape[1]), dim=1).indices
    return int((top == torch.from_numpy(truth)[:, None]).any(dim=1).sum())
