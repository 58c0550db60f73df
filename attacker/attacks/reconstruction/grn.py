"""Generative regression network (Luo et al., ICDE 2021; VFLAIR's "GRN"; ALGORITHMS.md §2.14): the
label party trains a generator from its own features and noise to the victim's features, so that
the trained model's output on the generated features matches its output on the real ones."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from attacker.attacks.base import ATTACKS, AttackParams, RunContext
from attacker.attacks.completion.engine import PartyView, load_parties
from attacker.attacks.reconstruction.base import FeatureReconstruction, Rebuilt, soft_forward
from splitleak.datasets import build_dataset
from splitleak.inputs import PartyInputs, load_party_inputs
from splitleak.models import Bottleneck, TopModel, build_top
from splitleak.partition import label_party_columns
from splitleak.seeding import derive_seed, generator, rng
from splitleak.settings import MAX_BATCH, MAX_EPOCHS, MAX_RATE

# Objectives whose prediction is more than the top model (and MID's bottlenecks) in top.pt.
NOT_PLAIN = {"cae": "its label decoder", "gafm": "its generator"}


class GrnParams(AttackParams):
    epochs: int = Field(60, ge=1, le=MAX_EPOCHS,
                        description="passes over the train rows (VFLAIR's MNIST config)")
    batch_size: int = Field(1024, ge=1, le=MAX_BATCH, description="train rows per generator step")
    lr: float = Field(0.005, gt=0, le=MAX_RATE, description="Adam learning rate (VFLAIR's MNIST config)")
    variance_weight: float = Field(0.0625, ge=0, description="λ of Σ_rows Var(x̂_row), the "
                                   "regulariser on the generated features (VFLAIR: 0.25 · 0.25)")
    max_rows: int = Field(512, ge=1, le=100_000, description="test rows scored")


def grn_generator(inputs: int, outputs: int) -> nn.Sequential:
    """VFLAIR's generator: Linear → LayerNorm → ReLU with 600, 200, 100 units, then linear."""
    layers: list[nn.Module] = []
    width = inputs
    for units in (600, 200, 100):
        layers += [nn.Linear(width, units), nn.LayerNorm(units), nn.ReLU()]
        width = units
    return nn.Sequential(*layers, nn.Linear(width, outputs))


@dataclass
class TrainedModel:
    """The whole trained model as the label party holds it after training: every party's bottom
    (the victim's too: Luo et al.'s adversary knows the model), its own columns and its top."""

    parties: list[PartyView]
    victim: int  # index into parties
    own: PartyInputs
    top: TopModel
    bottlenecks: list[Bottleneck] | None = None  # MID's, decoding the mean z = μ as it predicts

    @torch.no_grad()
    def activations(self, ids: torch.Tensor) -> list[torch.Tensor]:
        return [v.bottom(*v.rows(ids)) for v in self.parties]

    def predict(self, activations: list[torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
        if self.bottlenecks is not None:
            activations = [b(a, None) for b, a in zip(self.bottlenecks, activations, strict=True)]
        return self.top(activations, *self.own.rows(ids))


def load_trained(context: RunContext) -> TrainedModel:
    """The trained model from the run directory; ValueError with a sentence when GRN's premise
    fails (no own features, a prediction through more than the top model, missing files)."""
    cfg, run = context.cfg, context.run
    k = context.parties[0]
    if len(context.parties) != 1:
        raise ValueError(f"grn attacks one passive party at a time, not the group "
                         f"{'+'.join(map(str, context.parties))}")
    dataset = build_dataset(cfg.dataset.name, cfg.dataset.params)
    columns = label_party_columns(cfg, dataset.schema())
    if columns is None:
        raise ValueError("grn generates the victim's features from the attacker's own: the label "
                         "party holds none (features.label_party)")
    if cfg.objective.name in NOT_PLAIN:
        raise ValueError(f"grn needs the label party's prediction as its top model; objective "
                         f"'{cfg.objective.name}' also predicts through {NOT_PLAIN[cfg.objective.name]}")
    if not run.top_model.exists():
        raise ValueError(f"grn needs the label party's trained model at {run.top_model} (did the "
                         "run finish?)")
    parties = tuple(range(1, cfg.topology.passive_parties + 1))
    views = load_parties(run, cfg, parties, context.num_classes)
    own = load_party_inputs(cfg, dataset, columns)
    with torch.no_grad():
        shapes = [tuple(v.bottom(*v.rows(torch.zeros(1, dtype=torch.int64))).shape[1:]) for v in views]
    top = build_top(cfg.model, shapes, own.spec, cfg.output_width(context.num_classes), seed=0)
    state = torch.load(run.top_model, map_location="cpu", weights_only=True)
    top.load_state_dict(state["top"])
    bottlenecks = _bottlenecks(state, cfg.objective.params) if cfg.objective.name == "mid" else None
    for module in (top, *(v.bottom for v in views), *(bottlenecks or [])):
        module.eval().requires_grad_(False)
    return TrainedModel(views, parties.index(k), own, top, bottlenecks)


def _bottlenecks(state: dict, params: dict) -> list[Bottleneck]:
    """MID's bottlenecks, one per passive party, rebuilt from their saved weights' shapes."""
    weights = state["bottlenecks"]
    found = []
    for k in sorted({int(name.split(".")[0]) for name in weights}):
        encoder = weights[f"{k}.encoder.weight"]
        hidden = weights[f"{k}.decoder.0.weight"].shape[0]
        bottleneck = Bottleneck(encoder.shape[1], encoder.shape[0] // 2, hidden,
                                float(params.get("shift", 0.5)))
        bottleneck.load_state_dict({n.split(".", 1)[1]: w for n, w in weights.items()
                                    if n.split(".")[0] == str(k)})
        found.append(bottleneck)
    return found


def _own_features(own: PartyInputs, ids: torch.Tensor) -> torch.Tensor:
    """The attacker's known features of rows `ids`, flat: numerics, then one-hot categoricals."""
    numeric, categorical = own.rows(ids)
    parts = [numeric.flatten(1)] + [F.one_hot(categorical[:, j], c).float()
                                    for j, c in enumerate(own.spec.cardinalities)]
    return torch.cat(parts, 1)


class _Decoded:
    """Generator outputs as the victim's features: numerics in the range of its train values
    (a sigmoid, as VFLAIR's images in [0, 1]), one logit block per categorical field."""

    def __init__(self, victim: PartyView, train_ids: torch.Tensor) -> None:
        numeric = victim.rows(train_ids)[0]
        self.shape = tuple(numeric.shape[1:])
        self.flat = int(np.prod(self.shape))
        images = victim.inputs.spec.image_shape is not None
        flat = numeric.flatten(1)
        self.low = flat.min() if images else flat.min(0).values
        self.high = flat.max() if images else flat.max(0).values
        self.cards = victim.inputs.spec.cardinalities

    @property
    def width(self) -> int:
        return self.flat + sum(self.cards)

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        numeric = self.low + (self.high - self.low) * torch.sigmoid(out[:, : self.flat])
        logits = list(torch.split(out[:, self.flat:], list(self.cards), 1)) if self.cards else []
        return numeric.reshape(-1, *self.shape), logits


def train_grn(model: TrainedModel, train_ids: np.ndarray, params: GrnParams,
              seed: int) -> tuple[nn.Module, _Decoded]:
    """Luo et al.'s objective on batches of train rows: Σ‖f(x_own, G(x_own, r)) − f(x_own, x)‖²
    + λ·Σ_rows Var(G(x_own, r)_row), r ~ N(0, I) of the victim's feature size, Adam."""
    victim = model.parties[model.victim]
    decoded = _Decoded(victim, torch.from_numpy(train_ids))
    noise_width = decoded.flat + len(decoded.cards)
    own_width = _own_features(model.own, torch.zeros(1, dtype=torch.int64)).shape[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "grn", "init", victim.party_id))
        net = grn_generator(own_width + noise_width, decoded.width)
    optimizer = torch.optim.Adam(net.parameters(), lr=params.lr)
    noise = generator(seed, "grn", "noise", victim.party_id)
    order = rng(seed, "grn", "order", victim.party_id)
    for _ in range(params.epochs):
        shuffled = train_ids[order.permutation(train_ids.size)]
        for start in range(0, shuffled.size, params.batch_size):
            ids = torch.from_numpy(shuffled[start: start + params.batch_size])
            real = model.activations(ids)
            with torch.no_grad():
                target = model.predict(real, ids)
            r = torch.randn(ids.numel(), noise_width, generator=noise)
            numeric, logits = decoded.split(net(torch.cat([_own_features(model.own, ids), r], 1)))
            dummy = list(real)
            dummy[model.victim] = soft_forward(victim.bottom, numeric, logits)
            loss = ((model.predict(dummy, ids) - target) ** 2).sum()
            if params.variance_weight and numeric.flatten(1).shape[1] > 1:  # one value: no spread
                loss = loss + params.variance_weight * numeric.flatten(1).var(1).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return net.eval(), decoded


@ATTACKS.register("grn")
class GrnAttack(FeatureReconstruction):
    name = "grn"
    family = "feature_reconstruction"
    vflair = "GRN"
    side_knowledge = ("the label party: the trained model (every bottom, its top) and its own "
                      "features, on which it regresses the victim's")
    Params = GrnParams
    params: GrnParams

    def rebuild(self, context: RunContext) -> Rebuilt:
        model = load_trained(context)
        victim = model.parties[model.victim]
        net, decoded = train_grn(model, context.train_ids, self.params, context.seed)
        draw = rng(context.seed, "grn", "scored", victim.party_id)
        ids = context.test_ids
        if ids.size > self.params.max_rows:
            ids = np.sort(draw.choice(ids, size=self.params.max_rows, replace=False))
        rows = torch.from_numpy(ids)
        r = torch.randn(ids.size, decoded.flat + len(decoded.cards),
                        generator=generator(context.seed, "grn", "test", victim.party_id))
        with torch.no_grad():
            numeric, logits = decoded.split(net(torch.cat([_own_features(model.own, rows), r], 1)))
        categorical = torch.stack([z.argmax(1) for z in logits], 1) if logits else None
        return Rebuilt(victim, ids, context.train_ids, numeric, categorical,
                       {"train_rows": int(context.train_ids.size), "epochs": self.params.epochs})
