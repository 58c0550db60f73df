"""CAFE (Jin et al., NeurIPS 2021; ALGORITHMS.md §2.15): the label party, knowing a victim's bottom
and its aggregated parameter gradients at each recorded step and the batch's sample ids, fits a
dummy copy of every row the victim trained on: first the gradients of the first fully connected
layer's outputs, then that layer's inputs, then the data, in CAFE's three steps per step."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from pydantic import Field
from torch import nn

from attacker.attacks.base import ATTACKS, AttackParams, RunContext
from attacker.attacks.completion.engine import PartyView, load_parties
from attacker.attacks.reconstruction.base import FeatureReconstruction, Rebuilt
from splitleak.models import Bottom
from splitleak.seeding import generator, rng
from splitleak.settings import MAX_EPOCHS
from splitleak.white_box import read_snapshot_batch, snapshot_files


class CafeParams(AttackParams):
    passes: int = Field(20, ge=1, le=MAX_EPOCHS,
                        description="times the recorded steps are replayed, in order (the original "
                        "runs 20,000 iterations against a model that barely trains)")
    lr_first: float = Field(5e-3, gt=0, description="SGD step of the dummy first-layer output "
                            "gradients (step I; the original's)")
    lr_second: float = Field(1e-2, gt=0, description="Adam rate of the dummy first-layer inputs "
                             "(step II; the original's)")
    lr_data: float = Field(1e-2, gt=0, description="Adam rate of the dummy data (step III; the "
                           "original's)")
    tv_threshold: float = Field(25.0, ge=0, description="the total-variation term joins step III "
                                "while the dummy images' mean TV (on [0, 1] pixels) exceeds this")
    max_rows: int = Field(512, ge=1, le=100_000, description="rows scored, of those CAFE saw")


def first_linear(bottom: Bottom) -> tuple[str, nn.Linear]:
    """The bottom's first fully connected layer with a bias (CAFE's "first FC layer"), by name."""
    for name, module in bottom.named_modules():
        if isinstance(module, nn.Linear) and module.bias is not None:
            return name, module
    raise ValueError("cafe needs a fully connected layer with a bias in the victim's bottom model")


def total_variation(images: torch.Tensor) -> torch.Tensor:
    """Per image: the sum of |differences| of vertically and horizontally adjacent pixels, over
    channels (tf.image.total_variation, which the original uses)."""
    down = (images[..., 1:, :] - images[..., :-1, :]).abs().flatten(1).sum(1)
    right = (images[..., :, 1:] - images[..., :, :-1]).abs().flatten(1).sum(1)
    return down + right


PSNR_CAP = 100.0  # dB for a row rebuilt exactly (its PSNR is infinite)


def psnr(truth: np.ndarray, rebuilt: np.ndarray) -> float:
    """CAFE's metric: PSNR per row on [0, 1] values (the rebuilt ones clipped), averaged."""
    clipped = np.clip(rebuilt, 0.0, 1.0)
    mse = ((truth - clipped) ** 2).mean(1)
    with np.errstate(divide="ignore"):
        per_row = np.minimum(10 * np.log10(1.0 / mse), PSNR_CAP)
    return float(per_row.mean())


@dataclass
class Dummies:
    """CAFE's dummy copies of every train row (rows by position in the sorted train ids)."""

    train_ids: np.ndarray
    output_gradients: torch.Tensor  # [N, d_out]: V, the first FC layer's output gradients
    inputs: nn.Parameter  # [N, d_in]: H, the first FC layer's inputs
    data: nn.Parameter  # [N, features]: x̂, flat
    seen: set[int] = field(default_factory=set)

    def rows(self, sample_ids: np.ndarray, what: str) -> torch.Tensor:
        positions = np.searchsorted(self.train_ids, sample_ids)
        if (positions >= self.train_ids.size).any() or \
                not np.array_equal(self.train_ids[np.minimum(positions, self.train_ids.size - 1)],
                                   sample_ids):
            raise ValueError(f"{what}: a snapshot's batch holds rows that are not train rows")
        self.seen.update(sample_ids.tolist())
        return torch.from_numpy(positions)


class Scale:
    """The victim's value range (images: over every pixel; tables: per column) for [0, 1] views."""

    def __init__(self, numeric: torch.Tensor, images: bool) -> None:
        flat = numeric.flatten(1)
        self.low = flat.min() if images else flat.min(0).values
        self.high = flat.max() if images else flat.max(0).values

    def unit(self, values: torch.Tensor) -> torch.Tensor:
        return (values - self.low) / (self.high - self.low).clamp_min(1e-12)


def _sparse(rows: torch.Tensor, values: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    return torch.sparse_coo_tensor(rows[None], values, size, check_invariants=True)


class Cafe:
    """The three steps of one CAFE iteration against one recorded step of the victim."""

    def __init__(self, view: PartyView, bottom: Bottom, train_ids: np.ndarray, params: CafeParams,
                 seed: int) -> None:
        self.bottom = bottom.eval()
        self.params = params
        self.fc_name, fc = first_linear(bottom)
        self.names = [n for n, _ in bottom.named_parameters()]
        self.image_shape = view.inputs.spec.image_shape
        train = view.rows(torch.from_numpy(train_ids))[0]
        self.shape = tuple(train.shape[1:])
        self.scale = Scale(train, self.image_shape is not None)
        n = train_ids.size
        init = generator(seed, "cafe", "init", view.party_id)
        flat = int(np.prod(self.shape))
        start = torch.rand(n, *self.shape, generator=init)  # U[0, 1] in the raw range (original)
        data = (self.scale.low + start.flatten(1) * (self.scale.high - self.scale.low))
        self.dummies = Dummies(
            train_ids,
            (torch.rand(n, fc.out_features, generator=init) * 2 - 1) * 8e-4,
            nn.Parameter(torch.rand(n, fc.in_features, generator=init) * 8e-2),
            nn.Parameter(data.reshape(n, flat).clone()))
        self.adam_inputs = torch.optim.SparseAdam([self.dummies.inputs], lr=params.lr_second,
                                                  eps=1e-7)
        self.adam_data = torch.optim.SparseAdam([self.dummies.data], lr=params.lr_data, eps=1e-7)
        self._captured: torch.Tensor | None = None
        fc.register_forward_hook(self._capture)

    def _capture(self, module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        self._captured = args[0]

    def iterate(self, tensors: dict[str, torch.Tensor], sample_ids: np.ndarray) -> float:
        """Steps I, II and III on one recorded step; returns its gradient-matching loss D."""
        state = {n: t for n, t in tensors.items() if not n.startswith("grad.") and n != "cut_gradient"}
        self.bottom.load_state_dict(state)
        rows = self.dummies.rows(sample_ids, "cafe")
        weight_grad = tensors[f"grad.{self.fc_name}.weight"]
        bias_grad = tensors[f"grad.{self.fc_name}.bias"]
        # Step I: Σ_batch V ≈ ∇b (one SGD step on the batch's rows)
        v = self.dummies.output_gradients[rows].requires_grad_(True)
        loss = (v.sum(0) - bias_grad).square().sum()
        (grad,) = torch.autograd.grad(loss, v)
        self.dummies.output_gradients[rows] = (v - self.params.lr_first * grad).detach()
        v = self.dummies.output_gradients[rows]
        # Step II: Vᵀ H ≈ ∇W (one Adam step on the batch's rows of H)
        h = self.dummies.inputs[rows].detach().requires_grad_(True)
        loss = (weight_grad - v.T @ h).square().sum()
        (grad,) = torch.autograd.grad(loss, h)
        self.dummies.inputs.grad = _sparse(rows, grad, tuple(self.dummies.inputs.shape))
        self.adam_inputs.step()
        # Step III: the dummy data's gradients ≈ the real ones, its first-layer inputs ≈ H
        return self._data_step(rows, tensors)

    def _data_step(self, rows: torch.Tensor, tensors: dict[str, torch.Tensor]) -> float:
        x = self.dummies.data[rows].detach().requires_grad_(True)
        images = x.reshape(-1, *self.shape)
        categorical = torch.zeros(x.shape[0], 0, dtype=torch.int64)
        params = [dict(self.bottom.named_parameters())[n] for n in self.names]
        for p in params:
            p.requires_grad_(True)
        out = self.bottom(images, categorical)
        fake = torch.autograd.grad(out, params, grad_outputs=tensors["cut_gradient"].reshape(out.shape),
                                   create_graph=True)
        matching = 100 * torch.stack([(f - tensors[f"grad.{n}"]).square().sum()
                                      for f, n in zip(fake, self.names, strict=True)]).sum()
        assert self._captured is not None
        local = (self.dummies.inputs[rows].detach() - self._captured.flatten(1)).square().sum()
        total = 1e-4 * matching + 1e-3 * local
        if self.image_shape is not None:
            tv = total_variation(self.scale.unit(images)).mean()
            if tv.item() > self.params.tv_threshold:
                total = total + 1e-4 * tv
        (grad,) = torch.autograd.grad(total, x)
        self.dummies.data.grad = _sparse(rows, grad, tuple(self.dummies.data.shape))
        self.adam_data.step()
        return float(matching.detach())


@ATTACKS.register("cafe")
class CafeAttack(FeatureReconstruction):
    name = "cafe"
    family = "feature_reconstruction"
    side_knowledge = ("white box: the victim's bottom and its aggregated parameter gradients at "
                      "each snapshot step, the batch's sample ids and the cut gradient sent")
    Params = CafeParams
    params: CafeParams

    def rebuild(self, context: RunContext) -> Rebuilt:
        if len(context.parties) != 1:
            raise ValueError("cafe attacks one passive party at a time")
        k = context.parties[0]
        cfg, run = context.cfg, context.run
        snapshots = snapshot_files(run.bottom_white_box(k))
        if not snapshots:
            raise ValueError(f"cafe reads party {k}'s bottom and gradients per step at "
                             f"{run.bottom_white_box(k)}, which holds none (the party writes them "
                             "when [threat.receiver] cafe = true names it a victim)")
        view = load_parties(run, cfg, (k,), context.num_classes)[0]
        if view.inputs.spec.cardinalities:
            raise ValueError(f"cafe rebuilds numeric features and images; party {k} holds "
                             "categorical columns")
        cafe = Cafe(view, view.bottom, context.train_ids, self.params, context.seed)
        recorded = [read_snapshot_batch(path) for path in snapshots.values()]
        losses = []
        for _ in range(self.params.passes):
            for _, tensors, ids in recorded:
                if ids is None:
                    raise ValueError("cafe: a snapshot without the batch's sample ids (not CAFE's)")
                losses.append(cafe.iterate(tensors, ids))
        seen = np.array(sorted(cafe.dummies.seen), dtype=np.int64)
        ids = seen
        if ids.size > self.params.max_rows:
            draw = rng(context.seed, "cafe", "scored", k)
            ids = np.sort(draw.choice(ids, size=self.params.max_rows, replace=False))
        rows = cafe.dummies.rows(ids, "cafe")
        numeric = cafe.dummies.data[rows].detach().reshape(-1, *cafe.shape)
        truth = view.rows(torch.from_numpy(ids))[0]
        prior = view.rows(torch.from_numpy(context.train_ids))[0].mean(0, keepdim=True)
        unit = cafe.scale.unit
        figures = {"psnr": psnr(unit(truth).flatten(1).numpy(), unit(numeric).flatten(1).numpy()),
                   "psnr_prior": psnr(unit(truth).flatten(1).numpy(),
                                      unit(prior.expand_as(truth)).flatten(1).numpy()),
                   "snapshots": len(recorded), "passes": self.params.passes,
                   "iterations": len(losses), "gradient_match_first": losses[0],
                   "gradient_match_last": losses[-1], "rows_seen": int(seen.size)}
        return Rebuilt(view, ids, context.train_ids, numeric, None, figures)
