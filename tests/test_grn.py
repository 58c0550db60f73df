"""GRN (Luo et al.; ALGORITHMS.md §2.14): the generator against a hand-built model, its premise,
and a recorded run where it must beat the prior without a defense and fail under MID."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from attacker.analysis.analyze import analyze
from attacker.attacks.completion.engine import PartyView
from attacker.attacks.reconstruction.grn import GrnParams, TrainedModel, _own_features, train_grn
from splitleak.artifacts.paths import RunDir
from splitleak.inputs import PartyInputs
from splitleak.models import Bottom, InputSpec, TopModel
from tests.conftest import small_config
from tests.runs import reference_run


def _linear_model(rows: int = 600) -> tuple[TrainedModel, torch.Tensor]:
    """The victim's two features are a fixed linear map of the attacker's two, and its bottom
    is injective (2 -> 4), so matching the prediction pins the generator to that map."""
    torch.manual_seed(0)
    own_x = torch.rand(rows, 2)
    victim_x = own_x @ torch.tensor([[0.6, -0.3], [0.2, 0.7]]) + 0.1
    victim_layer, own_layer = nn.Linear(2, 4), nn.Linear(2, 4)
    with torch.no_grad():
        victim_layer.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0]]))
    empty = torch.zeros(rows, 0, dtype=torch.int64)
    victim = PartyView(1, PartyInputs(victim_x, empty, InputSpec(2, ())), Bottom(None, victim_layer))
    own = PartyInputs(own_x, empty, InputSpec(2, ()))
    top = TopModel("sum", None, own_bottom=Bottom(None, own_layer))
    for module in (top, victim.bottom):
        module.requires_grad_(False)
    return TrainedModel([victim], 0, own, top), victim_x


def test_the_generator_learns_the_victim_features_from_the_prediction() -> None:
    model, truth = _linear_model()
    train, test = np.arange(500), np.arange(500, 600)
    params = GrnParams(epochs=150, batch_size=50, lr=0.005, variance_weight=0.0)
    net, decoded = train_grn(model, train, params, seed=0)
    rows = torch.from_numpy(test)
    noise = torch.randn(test.size, 2)
    with torch.no_grad():
        rebuilt, _ = decoded.split(net(torch.cat([_own_features(model.own, rows), noise], 1)))
    error = float(((rebuilt - truth[rows]) ** 2).mean())
    assert error < 0.05 * float(truth[rows].var(0).mean())  # the prior (mean) scores 1.0 here
    again, _ = train_grn(model, train, params, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(),
                                                 again.state_dict().values(), strict=True))


def test_a_victim_of_one_numeric_column_has_no_variance_term() -> None:
    """The unbiased variance over a row's one numeric feature is NaN: GRN's loss was NaN, so a
    victim holding one column (or none but categoricals) was skipped as 'diverged'."""
    torch.manual_seed(0)
    own_x = torch.rand(100, 2)
    empty = torch.zeros(100, 0, dtype=torch.int64)
    victim = PartyView(1, PartyInputs(own_x[:, :1] * 0.5, empty, InputSpec(1, ())),
                       Bottom(None, nn.Linear(1, 4)))
    top = TopModel("sum", None, own_bottom=Bottom(None, nn.Linear(2, 4)))
    for module in (top, victim.bottom):
        module.requires_grad_(False)
    model = TrainedModel([victim], 0, PartyInputs(own_x, empty, InputSpec(2, ())), top)
    net, _ = train_grn(model, np.arange(100), GrnParams(epochs=2, batch_size=50), seed=0)
    assert all(torch.isfinite(p).all() for p in net.parameters())


def _grn_config(tmp_path: Path, **overrides: object) -> dict:
    """digits: the victim holds 3 pixel columns (24 pixels), the label party 3 others and the
    sum of both parties' 10 logits (VFLAIR's MNIST set-up, narrowed to make it invertible)."""
    data = small_config(
        tmp_path, dataset={"name": "digits", "test_fraction": 0.2},
        features={"passive": [[2, 5]], "label_party": [5, 8]},
        model={"kind": "mlp", "layers": [32], "cut_layer": 1, "top": "none", "aggregation": "sum"},
        training={"batch_size": 128, "epochs": 10, "eval_interval": 0},
        topology={"passive_parties": 1, "tls": False},
        threat={"parties": {"1": {"curious": False}},
                "receiver": {"victims": [1], "white_box": False, "back_mapping": False,
                             "grn": True}})
    data.update(overrides)
    return data


def _grn_entry(run: RunDir) -> dict:
    summary = analyze(run.root, [("grn", {"batch_size": 64, "epochs": 30})])
    return next(e for e in summary["leak"] if e["name"] == "grn")


def test_grn_premise_is_the_attackers_own_features(tmp_path: Path) -> None:
    data = _grn_config(tmp_path, features={"passive": [[2, 5]]}, training={
        "batch_size": 128, "epochs": 1, "eval_interval": 0})
    entry = _grn_entry(reference_run(data))
    assert entry["skipped"] == 1 and "reconstruction" not in entry
    assert "holds none (features.label_party)" in entry["error"]
    assert entry["family"] == "feature_reconstruction" and entry["ap"]["value"] is None


def test_grn_beats_the_prior_without_a_defense_and_fails_under_mid(tmp_path: Path) -> None:
    plain = _grn_entry(reference_run(_grn_config(tmp_path)))
    r = plain["reconstruction"]
    assert plain["vflair"] == "GRN" and r["metric"] == "ssim" and r["rows"] > 300
    assert r["ssim"] > r["prior"]["ssim"] + 0.1  # SSIM is the headline for images
    assert plain["ap"]["value"] == pytest.approx(max(0.0, 1 - r["mse_range"]))
    mid = _grn_entry(reference_run(_grn_config(tmp_path, objective={"name": "mid", "lambda": 1.0})))
    defended = mid["reconstruction"]
    assert defended["ssim"] < defended["prior"]["ssim"] + 0.05  # nothing past the prior
    assert defended["mse"] > defended["prior"]["mse"]
