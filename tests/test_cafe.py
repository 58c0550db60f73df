"""CAFE (Jin et al.; ALGORITHMS.md §2.15): its pieces by hand, its premise, and a recorded run
where it must beat the prior without a defense and fail when the victim protects its images."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from attacker.analysis.analyze import analyze
from attacker.analysis.run_level import below_prior
from attacker.attacks.reconstruction.cafe import first_linear, psnr, total_variation
from splitleak.artifacts.paths import RunDir
from splitleak.models import Bottom
from splitleak.white_box import read_snapshot_batch, snapshot_files
from tests.conftest import small_config
from tests.runs import reference_run


def test_psnr_and_total_variation_by_hand() -> None:
    truth = np.array([[0.0, 0.5, 1.0, 1.0], [0.2, 0.2, 0.2, 0.2]])
    rebuilt = truth + np.array([[0.1, -0.1, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # row 1: the rebuilt 1.5 is clipped to 1 -> MSE (0.01 + 0.01) / 4 = 0.005 -> 23.01 dB
    first = 10 * math.log10(1 / 0.005)
    assert psnr(truth[:1], rebuilt[:1]) == pytest.approx(first)
    assert psnr(truth[1:], truth[1:] + 0.1) == pytest.approx(20.0)  # MSE 0.01, nothing clipped
    assert psnr(truth, rebuilt) == pytest.approx((first + 100.0) / 2)  # exact row: capped
    image = torch.tensor([[[[0.0, 1.0], [3.0, 3.0]]]])
    assert total_variation(image).item() == pytest.approx(3 + 2 + 1 + 0)  # sums, not means


def test_the_first_fully_connected_layer_with_a_bias() -> None:
    bottom = Bottom(None, nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 4, bias=False),
                                        nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))
    name, layer = first_linear(bottom)
    assert name == "body.3" and layer.out_features == 3
    with pytest.raises(ValueError, match="fully connected layer with a bias"):
        first_linear(Bottom(None, nn.Sequential(nn.Linear(4, 2, bias=False))))


def _cafe_config(tmp_path: Path, **overrides: object) -> dict:
    """CAFE's regime: a model that barely trains (the original's learning rate 1e-6), small
    batches over few rows (200 digits), every step recorded; a conv block, then the first fully
    connected layer on the victim's side."""
    data = small_config(
        tmp_path, dataset={"name": "digits", "test_fraction": 0.2, "subset": 0.15},
        features={"passive": [[0, 4]], "label_party": [4, 8]},
        model={"kind": "cnn", "channels": [16], "layers": [64], "cut_layer": 2},
        training={"batch_size": 20, "epochs": 40, "eval_interval": 0,
                  "optimizer": {"name": "sgd", "lr": 1e-6}},
        topology={"passive_parties": 1, "tls": False},
        threat={"parties": {"1": {"curious": False}},
                "receiver": {"victims": [1], "white_box": False, "back_mapping": False,
                             "cafe": True},
                "white_box": {"max_snapshots": 1000}})
    data.update(overrides)
    return data


def _cafe(run: RunDir) -> dict:
    summary = analyze(run.root, [("cafe", {"passes": 6})])
    entry = next(e for e in summary["leak"] if e["name"] == "cafe")
    below = [w for w in summary["warnings"] if "scores below the prior" in w]
    assert bool(below) == (below_prior(entry["reconstruction"]) is not None), below
    return entry


def test_a_reconstruction_below_its_prior_is_named() -> None:
    """CAFE on a table can end far from the data (R² -10): the analysis warns when any headline
    (or CAFE's PSNR) is below the constant guess's."""
    assert below_prior({"metric": "r2", "value": -10.0, "prior": {"value": 0.0},
                         "psnr": 9.0, "psnr_prior": 12.5}) == "r2 -10 < 0; PSNR 9 < 12.5"
    assert below_prior({"metric": "ssim", "ssim": 0.6, "prior": {"ssim": 0.16},
                         "psnr": 20.0, "psnr_prior": 12.0}) is None
    assert below_prior({"metric": "ssim", "ssim": 0.1, "prior": {"ssim": 0.16}}) == "ssim 0.1 < 0.16"


def test_the_victim_records_its_bottom_gradients_and_batch(tmp_path: Path) -> None:
    run = reference_run(_cafe_config(tmp_path, training={"batch_size": 20, "epochs": 1,
                                                     "eval_interval": 0}))
    files = snapshot_files(run.bottom_white_box(1))
    assert list(files) == list(range(len(files))) and len(files) == 11  # ⌈216 / 20⌉ steps
    step, tensors, ids = read_snapshot_batch(files[3])
    assert step == 3 and ids is not None and ids.size == 20
    assert tensors["cut_gradient"].shape == (20, 64)
    assert tensors["grad.body.2.0.weight"].shape == tensors["body.2.0.weight"].shape
    assert not (run.white_box).exists()  # the label party's EXACT snapshots are another threat


def test_cafe_premise_is_the_victims_shared_gradients(tmp_path: Path) -> None:
    data = _cafe_config(tmp_path, training={"batch_size": 20, "epochs": 1, "eval_interval": 0})
    data["threat"]["receiver"] = {"victims": [1], "white_box": False, "back_mapping": True}
    entry = next(e for e in analyze(reference_run(data).root, [("cafe", {})])["leak"]
                 if e["name"] == "cafe")
    assert entry["skipped"] == 1 and "holds none" in entry["error"]
    assert entry["family"] == "feature_reconstruction"


def test_cafe_rebuilds_the_images_and_fails_on_protected_ones(tmp_path: Path) -> None:
    plain = _cafe(reference_run(_cafe_config(tmp_path)))["reconstruction"]
    assert plain["ssim"] > plain["prior"]["ssim"] + 0.2 and plain["mse"] < plain["prior"]["mse"]
    assert plain["psnr"] > plain["psnr_prior"] + 1.0 and plain["rows_seen"] == 216
    assert plain["gradient_match_last"] < plain["gradient_match_first"]
    protected = _cafe(reference_run(_cafe_config(tmp_path, protection={
        "name": "antigan", "parties": [1],
        "params": {"steps": 30, "pretrain_epochs": 1, "batch_size": 32, "mix": 0.1}})))
    rebuilt = protected["reconstruction"]  # it rebuilds what the victim trained on: 90 % noise
    assert rebuilt["ssim"] < rebuilt["prior"]["ssim"] + 0.05
