"""Feature reconstruction from received activations (ALGORITHMS.md §2.11): the pieces against
hand computations, and both attacks end to end on a recorded run (images and a table)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from attacker.analysis.analyze import analyze
from attacker.attacks.completion.engine import PartyView
from attacker.attacks.reconstruction.back_mapping import BackMappingParams, back_map
from attacker.attacks.reconstruction.base import Victim, grid_rows, image_scores, ssim_window, tabular_scores
from attacker.attacks.reconstruction.inversion import InversionParams, invert, total_variation
from splitleak.config import ConfigError, parse_config
from splitleak.inputs import PartyInputs
from splitleak.models import Bottom, InputSpec
from tests.conftest import small_config
from tests.runs import reference_run


def test_total_variation_by_hand() -> None:
    image = torch.tensor([[[[0.0, 1.0], [3.0, 3.0]]]])
    # vertical |3-0|, |3-1| -> mean 2.5; horizontal |1-0|, |3-3| -> mean 0.5
    assert total_variation(image).item() == pytest.approx(3.0)


def test_ssim_window_fits_the_image() -> None:
    assert ssim_window((1, 28, 14)) == 7
    assert ssim_window((1, 8, 4)) == 3
    with pytest.raises(ValueError, match="too small for SSIM"):
        ssim_window((1, 8, 2))


def test_ssim_is_class_conditional_and_perfect_on_the_truth() -> None:
    rng = np.random.default_rng(0)
    truth = rng.random((5, 1, 8, 8)).astype(np.float32)
    same = image_scores(truth, truth.copy(), np.array([0, 0, 0, 0, 1]))
    assert same["ssim"] == pytest.approx(1.0) and same["mse"] == 0.0
    # four rows of class 0 rebuilt perfectly, the one row of class 1 as noise: the class average
    # weighs the classes equally (SSIM_1 + 1) / 2, the row average 4 of 5 rows
    rebuilt = truth.copy()
    rebuilt[4] = rng.random((1, 8, 8))
    scores = image_scores(truth, rebuilt, np.array([0, 0, 0, 0, 1]))
    one = scores["ssim_by_class"][1]
    assert one < 0.5 and scores["ssim_by_class"][0] == pytest.approx(1.0)
    assert scores["ssim"] == pytest.approx((1.0 + one) / 2)
    assert scores["ssim_rows"] == pytest.approx((4.0 + one) / 5)


def test_tabular_scores_by_hand() -> None:
    numeric = np.array([[1.0, 0.0], [2.0, 1.0], [3.0, 0.0], [4.0, 1.0]])
    rebuilt = numeric.copy()
    rebuilt[:, 1] = 0.5  # the mean: R² 0
    codes = np.array([[0], [1], [2], [1]])
    scores = tabular_scores(numeric, rebuilt, codes, np.array([[0], [1], [0], [0]]), ["a", "b", "c"])
    assert scores["r2"] == {"a": 1.0, "b": 0.0} and scores["accuracy"] == {"c": 0.5}
    assert scores["metric"] == "r2" and scores["value"] == pytest.approx(0.5)


def test_one_tabular_victim_row_is_refused_with_a_sentence() -> None:
    """max_rows = 1 (its lower bound) on a table: R² of one row is undefined, so the attack is
    skipped with the reason (a ValueError the analysis turns into a warning), not a traceback;
    categorical columns alone are still scored."""
    one = np.array([[1.0, 2.0]])
    with pytest.raises(ValueError, match="R² needs at least 2 victim rows, and 1 was scored"):
        tabular_scores(one, one, np.zeros((1, 0), dtype=np.int64), np.zeros((1, 0), dtype=np.int64),
                       ["a", "b"])
    codes = np.array([[3]])
    scores = tabular_scores(np.zeros((1, 0)), np.zeros((1, 0)), codes, codes, ["c"])
    assert scores["value"] == 1.0 and scores["metric"] == "feature_accuracy"


def test_the_grid_shows_the_first_row_of_each_class_first() -> None:
    ids = np.array([10, 11, 12, 13, 14])
    labels = np.array([1, 0, 1, 0, 2])
    shown = grid_rows(ids, labels)
    assert list(ids[shown][:3]) == [11, 10, 14] and sorted(shown) == list(range(5))


def _linear_victim(rows: int = 64, aux: int = 256) -> tuple[Victim, torch.Tensor]:
    """A victim whose bottom is an invertible linear map of 4x4 images (16 -> 16)."""
    torch.manual_seed(0)
    images = torch.rand(rows + aux, 1, 4, 4)
    layer = nn.Linear(16, 16)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(16) * 2 + 0.1 * torch.randn(16, 16))
    bottom = Bottom(None, nn.Sequential(nn.Flatten(), layer))
    inputs = PartyInputs(images, torch.zeros(rows + aux, 0, dtype=torch.int64),
                         InputSpec(0, (), (1, 4, 4)))
    with torch.no_grad():
        h = bottom(images, inputs.categorical).numpy()
    ids, aux_ids = np.arange(rows), np.arange(rows, rows + aux)
    return Victim(PartyView(1, inputs, bottom), ids, h[ids], 0, aux_ids, h[aux_ids]), images[:rows]


def test_inversion_recovers_an_invertible_bottom() -> None:
    victim, truth = _linear_victim()
    numeric, categorical = invert(victim, InversionParams(steps=600, lr=0.05, tv=0.0))
    assert categorical is None
    assert torch.allclose(numeric, truth, atol=2e-3)


def test_back_mapping_learns_a_linear_map_from_the_auxiliary_rows() -> None:
    victim, truth = _linear_victim()
    numeric, _ = back_map(victim, BackMappingParams(steps=1500, hidden=64), seed=0)
    assert float(((numeric - truth) ** 2).mean()) < 0.1 * float(truth.var())
    again, _ = back_map(victim, BackMappingParams(steps=1500, hidden=64), seed=0)
    assert torch.equal(numeric, again)  # deterministic by seed


def _receiver_config(tmp_path: Path, **overrides: object) -> dict:
    data = small_config(
        tmp_path, dataset={"name": "digits", "test_fraction": 0.2},
        features={"passive": [[0, 4], [4, 8]]},
        model={"kind": "cnn", "channels": [8], "layers": [32], "cut_layer": 1},
        training={"batch_size": 64, "epochs": 2, "eval_interval": 0},
        threat={"parties": {"2": {"curious": True}}, "receiver": {"victims": [1]}})
    data.update(overrides)
    return data


def test_the_threat_model_states_what_reconstruction_needs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs attacker.enabled = true"):
        parse_config(_receiver_config(tmp_path, attacker={"enabled": False}))
    with pytest.raises(ConfigError, match=r"threat.receiver.victims names \[3\]; this run has "
                       r"passive parties 1..2"):
        parse_config(_receiver_config(tmp_path, threat={"receiver": {"victims": [3]}}))
    with pytest.raises(ConfigError, match="names a party twice"):
        parse_config(_receiver_config(tmp_path, threat={"receiver": {"victims": [1, 1]}}))
    with pytest.raises(ConfigError, match="every attack is off"):
        parse_config(_receiver_config(tmp_path, threat={"receiver": {
            "victims": [1], "white_box": False, "back_mapping": False}}))
    cfg = parse_config(_receiver_config(tmp_path))
    assert cfg.received_parties == [1] and cfg.tapped_parties == [2] and cfg.sidecar_needed


def test_both_attacks_rebuild_images_better_than_the_prior(tmp_path: Path) -> None:
    """digits halves (8x4) through a conv cut: both attacks beat the mean-image prior on SSIM and
    MSE; the report has the section and the grid; a second analysis gives the same numbers."""
    from attacker.report.report import write_report

    run = reference_run(_receiver_config(tmp_path))
    summary = analyze(run.root)
    entries = {e["attack"]: e for e in summary["leak"] if e["layer"] == "input"}
    assert set(entries) == {"inversion", "back_mapping"}
    for entry in entries.values():
        r = entry["reconstruction"]
        assert entry["metric"] == "ssim" and entry["ssim"]["mean"] == r["ssim"]
        assert r["ssim"] > r["prior"]["ssim"] + 0.2 and r["mse"] < r["prior"]["mse"]
        assert r["rows"] > 100 and r["ssim_window"] == 3 and "victim: party 1" in entry["threat"]
    write_report(run, summary)
    report = (run.report / "report.md").read_text()
    assert "## Feature reconstruction" in report and "reconstruction_party1.png" in report
    assert (run.report / "reconstruction_party1.png").stat().st_size > 1000
    again = {e["attack"]: e for e in analyze(run.root)["leak"] if e["layer"] == "input"}
    for name, entry in entries.items():
        assert again[name]["reconstruction"]["ssim"] == entry["reconstruction"]["ssim"]


def test_tabular_features_are_scored_per_column(tmp_path: Path) -> None:
    """breast_cancer (numeric columns): per-feature R², the decoder above the prior's 0."""
    data = small_config(tmp_path, training={"epochs": 3, "eval_interval": 0},
                        threat={"parties": {"1": {}}, "receiver": {"victims": [1],
                                                                   "auxiliary_fraction": 0.3}})
    run = reference_run(data)
    summary = analyze(run.root, [("back_mapping", {"auxiliary_fraction": 0.3, "steps": 1500})])
    entry = next(e for e in summary["leak"] if e["layer"] == "input" and e["party_id"] == 1)
    r = entry["reconstruction"]
    assert entry["metric"] == "r2" and len(r["r2"]) == 15 and "mean radius" in r["r2"]
    assert r["value"] > 0.3 and abs(r["prior"]["value"]) < 0.05


def test_the_console_table_fits_80_columns() -> None:
    from rich.console import Console

    from attacker.attacks.reconstruction.report import reconstruction_table

    figures = {"metric": "ssim", "ssim": 0.5971, "mse": 0.1931, "rows": 512, "auxiliary_rows": 400,
               "cpu_seconds": 15.6, "prior": {"ssim": 0.1601, "mse": 0.7212}}
    summary = {"leak": [{"scope": "run", "layer": "input", "party_id": 1, "attack": name,
                         "reconstruction": figures} for name in ("inversion", "back_mapping")]}
    console = Console(width=80, record=True)
    console.print(reconstruction_table(summary))
    lines = console.export_text().splitlines()
    assert max(map(len, lines)) <= 80
    assert any(line.split() == ["1", "back_mapping", "0.597", "0.160", "0.193", "0.721", "512",
                                "400", "16"] for line in lines)


@pytest.mark.parametrize("metric", ["ssim", "r2"])
def test_the_console_table_explains_ssim_only_where_it_shows_it(metric: str) -> None:
    """A table of tabular reconstructions only was captioned with SSIM's definition."""
    from attacker.attacks.reconstruction.report import reconstruction_table

    figures = {"metric": metric, "ssim": 0.5, "mse": 0.2, "value": 0.5, "r2": {}, "accuracy": {},
               "rows": 512, "prior": {"ssim": 0.1, "mse": 0.7, "value": 0.0}}
    summary = {"leak": [{"scope": "run", "layer": "input", "party_id": 1, "attack": "inversion",
                         "metric": metric, "reconstruction": figures}]}
    table = reconstruction_table(summary)
    assert table is not None and "prior: every row rebuilt" in str(table.caption)
    assert ("SSIM: class-conditional" in str(table.caption)) == (metric == "ssim")


def test_mse_on_range_scaled_features_by_hand() -> None:
    """VFLAIR's feature-reconstruction AP reads the MSE of features scaled to [0, 1]: an image's
    on its [0, 1] pixels (the reconstruction clipped to them, as its SSIM), a table's per column
    over each column's range."""
    truth = np.array([[[[0.0, 2.0, 4.0]]]] * 3, dtype=np.float32).reshape(3, 1, 1, 3).repeat(3, 2)
    scores = image_scores(truth, truth + 1.0, np.array([0, 1, 2]), pixel_scale=(0.0, 0.25))
    # pixels 0, 0.5, 1 against 0.25, 0.75, min(1.25, 1): squared errors 1/16, 1/16, 0
    assert scores["mse"] == pytest.approx(1.0) and scores["mse_range"] == pytest.approx(1 / 24)
    numeric = np.array([[0.0, 10.0], [2.0, 30.0]])
    table = tabular_scores(numeric, numeric + np.array([1.0, 10.0]), np.zeros((2, 0)),
                           np.zeros((2, 0)), ["a", "b"])
    assert table["mse_range"] == pytest.approx(((1 / 2) ** 2 + (10 / 20) ** 2) / 2)


def test_report_md_names_every_victims_threat_and_has_no_empty_column() -> None:
    from attacker.attacks.reconstruction.report import reconstruction_md

    figures = {"metric": "r2", "value": 0.41, "mse": 0.6, "r2": {"mean radius": 0.5}, "accuracy": {},
               "rows": 100, "auxiliary_rows": 30, "cpu_seconds": 2.0, "prior": {"value": 0.0}}
    summary = {"leak": [{"scope": "run", "layer": "input", "party_id": k, "attack": "back_mapping",
                         "name": "back_mapping", "threat": threat, "reconstruction": figures}
                        for k, threat in ((1, "honest victim"), (2, "curious victim"))]}
    lines = reconstruction_md(summary)
    assert "Threat: victim 1: honest victim; victim 2: curious victim." in lines[2]
    table = [line for line in lines if line.startswith("|")]
    assert table and all("|  |" not in line and "| |" not in line for line in table)
    assert table[0].startswith("| victim | attack | headline | prior | MSE | per feature")
    assert table[2].startswith("| 1 | back_mapping | r2 0.410 | 0.000 | 0.600 | mean radius 0.500 | 100 |")


def test_an_rgb_grid_shows_standardised_pixels_mapped_onto_the_unit_range(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """CIFAR strips are standardised (about -1.7..1.7): the grid clipped RGB images to [0, 1]
    (everything below the mean black) and matplotlib warned 30 times per report."""
    import matplotlib.image

    from attacker.report.plots import reconstruction_grid

    rng = np.random.default_rng(0)
    truth = rng.normal(size=(4, 3, 8, 8)).astype(np.float32)
    grids = [("inversion", {"truth": truth, "rebuilt": truth * 0.5, "labels": np.arange(4)})]
    with caplog.at_level("WARNING"):
        reconstruction_grid(grids, tmp_path / "grid.png")
    assert not [r for r in caplog.records if "Clipping input data" in r.getMessage()]
    pixels = matplotlib.image.imread(tmp_path / "grid.png")[..., :3]
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 100  # not a few saturated colours


def test_a_reanalysis_swaps_the_grids_in_with_the_rest(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The grids' .npz are staged like the leak files: a re-analysis that fails leaves the
    previous ones as they were (none beside the old summary from the new one), and one that
    finishes removes a grid its summary no longer has."""
    from attacker.report import pipeline

    run = reference_run(_receiver_config(tmp_path, training={
        "batch_size": 64, "epochs": 1, "eval_interval": 0}))
    attacks = [("inversion", {"steps": 20}), ("back_mapping", {"steps": 50})]
    pipeline.analyse_and_report(run.root, attacks, jobs=1)
    grids = {name: run.attacker / "reconstruction" / f"{name}_party1.npz" for name, _ in attacks}
    before = {name: path.read_bytes() for name, path in grids.items()}

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run.leak_summary))

    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "write_summary", full)
        with pytest.raises(OSError, match="No space left"):
            pipeline.analyse_and_report(run.root, attacks, seed=7, jobs=1)  # other victim rows
    assert {name: path.read_bytes() for name, path in grids.items()} == before
    left = sorted(p.name for p in (run.attacker / "reconstruction").iterdir())
    assert left == sorted(p.name for p in grids.values())  # no staging folder left either
    pipeline.analyse_and_report(run.root, attacks[1:], seed=7, jobs=1)
    assert not grids["inversion"].exists() and grids["back_mapping"].read_bytes() != before["back_mapping"]
    assert (run.report / "reconstruction_party1.png").exists()


def test_a_diverged_reconstruction_is_skipped_saying_so(tmp_path: Path) -> None:
    """An lr far too large (its bound is only > 0) gives NaN: the entry is skipped with a
    sentence that says the attack diverged, not scikit-learn's "Input contains NaN"."""
    data = small_config(tmp_path, training={"epochs": 1, "eval_interval": 0},
                        threat={"parties": {"1": {}}, "receiver": {"victims": [1]}})
    run = reference_run(data)
    summary = analyze(run.root, [("inversion", {"lr": 1e30, "steps": 3})])
    entry = next(e for e in summary["leak"] if e["layer"] == "input" and e["party_id"] == 1)
    assert entry["skipped"] == 1 and "inversion diverged" in entry["error"], entry
    assert any("inversion diverged" in w for w in summary["warnings"])


def test_a_named_reconstruction_takes_the_threat_models_rows(tmp_path: Path) -> None:
    """`--attacks inversion` (or [[attacker.attacks]]) scored 512 rows with 10 % auxiliary rows
    although [threat.receiver] said max_rows = 50 and auxiliary_fraction = 0.3: a named attack
    takes the threat model's side knowledge, as a named model completion its labels do; a
    parameter it names still wins."""
    data = small_config(tmp_path, training={"epochs": 1, "eval_interval": 0},
                        threat={"parties": {"2": {}}, "receiver": {
                            "victims": [1], "auxiliary_fraction": 0.3, "max_rows": 50}})
    run = reference_run(data)
    own = {e["party_id"]: e for e in analyze(run.root)["leak"] if e.get("name") == "inversion"}
    named = {e["party_id"]: e for e in analyze(run.root, [("inversion", {})])["leak"]
             if e.get("name") == "inversion"}
    assert named[1]["attack"] == own[1]["attack"] == "inversion(auxiliary_fraction=0.3, max_rows=50)"
    from attacker.analysis.summary import TIMING_KEYS  # the analysis' own time, not a figure

    figures = [{k: v for k, v in e["reconstruction"].items() if k not in TIMING_KEYS}
               for e in (named[1], own[1])]
    assert figures[0] == figures[1] and len(figures[0]) > 5, figures
    assert named[1]["reconstruction"]["rows"] == 50
    assert "inversion" == named[2]["attack"] and named[2]["skipped"] == 1  # not a victim
    mine = analyze(run.root, [("inversion", {"max_rows": 20})])["leak"]
    assert next(e for e in mine if e["party_id"] == 1)["reconstruction"]["rows"] == 20
