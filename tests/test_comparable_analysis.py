"""Numbers comparable with the literature, attacker side (issue 25): VFLAIR's threshold accuracy,
attacks skipped where their premise fails, clean anchors at every layer scored, SSIM on [0, 1]
pixels, and EXACT's exact ties counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from skimage.metrics import structural_similarity

from attacker.analysis.analyze import analyze
from attacker.analysis.leak import evaluate_batch
from attacker.attacks import build_attack
from attacker.attacks.base import RunFacts
from attacker.attacks.exact.exact import Candidates, _scores, reconstruct, settle_ties
from attacker.attacks.reconstruction.base import image_scores
from attacker.report.terminal import leak_table
from attacker.sidecar.store import GradientStore
from splitleak.artifacts.paths import RunDir
from splitleak.config import ModelConfig
from splitleak.models import InputSpec, build_top
from splitleak.white_box import OwnColumns
from tests.test_attacks_benchmarks import synthetic_run

# --- 1. VFLAIR's attack performance: the threshold rule's accuracy ----------------------------


def test_the_norm_and_cosine_thresholds_are_vflairs() -> None:
    """NormbasedScoring: norms min-max normalised over the batch, positive above 0.5, then
    max(acc, 1 − acc) (data_process.py); DirectionbasedScoring: cosine with the anchor above 0."""
    labels = np.array([1, 1, 0, 0, 0, 0])
    norms = np.array([1.0, 0.2, 0.3, 0.1, 0.4, 0.9])  # min-max: 1, .11, .22, 0, .33, .89
    gradients = norms[:, None].astype(np.float32)
    leak = evaluate_batch(build_attack("norm", {}), gradients, labels, np.random.default_rng(0))
    assert leak.threshold_accuracy == pytest.approx(4 / 6)  # rows 0 and 5 called positive
    flipped = evaluate_batch(build_attack("norm", {}), gradients, 1 - labels, np.random.default_rng(0))
    assert flipped.threshold_accuracy == pytest.approx(4 / 6)  # max(2/6, 1 − 2/6)
    assert leak.auc is not None and leak.auc.raw == pytest.approx(5 / 8)  # the AUC is unchanged

    anchor = np.array([1.0, 0.0], dtype=np.float32)
    rows = np.array([[1, 0], [1, 1], [-1, 0.5], [0.2, -1], [-1, -1]], dtype=np.float32)
    y = np.array([1, 1, 0, 0, 0])
    oracle = evaluate_batch(build_attack("cosine_oracle", {}), rows, y, np.random.default_rng(0),
                            clean_anchor=(0, anchor))
    # row 0 is the anchor (excluded); cos > 0 for rows 1 and 3: 3 of the 4 rows right, not flipped
    assert oracle.threshold_accuracy == pytest.approx(3 / 4)
    wrong = evaluate_batch(build_attack("cosine_oracle", {}), -rows, y, np.random.default_rng(0),
                           clean_anchor=(0, anchor))
    assert wrong.threshold_accuracy == pytest.approx(1 / 4)  # no flip for the direction attack


def test_the_analysis_summarises_the_threshold_accuracy(tmp_path: Path) -> None:
    run = _binary_run(tmp_path, defense=False)
    summary = analyze(run.root, [("norm", {}), ("clustering", {})])
    leak = pq.read_table(run.attacker / "leak.parquet").to_pylist()
    scored = [r for r in leak if r["attack"] == "norm" and r["layer"] == "cut"]
    entry = _entry(summary, "norm", "cut")
    assert entry["threshold_accuracy"]["mean"] == pytest.approx(
        np.mean([r["threshold_accuracy"] for r in scored]))
    assert "VFLAIR's NormbasedScoring" in entry["threshold_rule"]
    assert "smaller k-means cluster" in _entry(summary, "clustering", "cut")["threshold_rule"]


# --- 2 and 3. Premises: no top model for the logit attacks, a clean anchor per layer -----------


def test_logit_attacks_are_skipped_with_their_reason_when_there_is_a_top_model(tmp_path: Path) -> None:
    attacks = [("direct_label", {}), ("batch_label_counts", {})]
    plain = synthetic_run(tmp_path / "no_top", classes=3, width=3, batches=[(0, 0), (0, 1)])
    scored = analyze(plain.root, attacks)
    assert _entry(scored, "direct_label", "cut")["pooled"]["accuracy"] == 1.0
    assert "premise" not in _entry(scored, "batch_label_counts", "cut")

    topped = synthetic_run(tmp_path / "top", classes=3, width=3, batches=[(0, 0), (0, 1)])
    topped.config.write_text('[run]\nseed = 5\n\n[model]\ntop = "mlp"\n')
    summary = analyze(topped.root, attacks)
    for name in ("direct_label", "batch_label_counts"):
        entry = _entry(summary, name, "cut")
        assert "top model" in entry["premise"] and entry["skipped"] == entry["batches"] == 2
    assert _entry(summary, "direct_label", "cut")["pooled"]["accuracy"] is None  # never scored
    leak = pq.read_table(topped.attacker / "leak.parquet").to_pylist()
    assert {r["skip_kind"] for r in leak} == {"premise"}
    assert all(r["skip_reason"].startswith("premise: needs the gradient of the logits") for r in leak)


def test_premises_stated_by_each_attack() -> None:
    top, flat = RunFacts(True, False, False), RunFacts(False, False, False)
    for name in ("direct_label", "batch_label_counts"):
        assert "model.top = 'none'" in build_attack(name, {}).premise(top, "cut")
        assert build_attack(name, {}).premise(flat, "cut") is None
    oracle = build_attack("cosine_oracle", {})
    defended, group = RunFacts(True, True, False), RunFacts(True, True, True)
    assert oracle.premise(defended, "cut") is None  # the label party's clean anchors
    assert "first layer" in oracle.premise(defended, "first")
    assert "colluding" in oracle.premise(group, "cut")
    assert oracle.premise(RunFacts(True, False, True), "first") is None  # received = clean
    for name in ("norm", "cosine_majority", "clustering", "mean"):
        assert build_attack(name, {}).premise(group, "first") is None


def test_the_cosine_oracle_scores_only_layers_with_a_clean_anchor(tmp_path: Path) -> None:
    """Under a defense the first layer has no clean anchor: skipped, never scored with the noised
    received row; so is a cut-layer draw the label party's artifact lacks, and the warning names
    the layer and counts every draw. Without a defense every layer is scored."""
    plain = analyze(_binary_run(tmp_path / "plain", defense=False).root, [("cosine_oracle", {})],
                    draws=2)
    assert "premise" not in _entry(plain, "cosine_oracle", "first")
    assert _entry(plain, "cosine_oracle", "first")["flipped"]["n"] == 4
    assert not any("clean anchor" in w for w in plain["warnings"])

    run = _binary_run(tmp_path / "marvell", defense=True)
    summary = analyze(run.root, [("cosine_oracle", {})], draws=2)
    first = _entry(summary, "cosine_oracle", "first")
    assert "no clean anchor for the first layer" in first["premise"]
    assert first["skipped"] == first["batches"] == 4
    cut = _entry(summary, "cosine_oracle", "cut")
    assert "no clean anchor" in cut["premise"] and cut["skipped"] == cut["batches"] == 4
    (warning,) = [w for w in summary["warnings"] if "clean anchor" in w]
    assert "cosine_oracle, cut layer: 8 batch draw(s)" in warning  # 4 batches x 2 draws
    assert "clean_anchors.arrows" in warning and "skipped" in warning and "scored" in warning
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(leak_table(summary))
    text = console.export_text()
    assert "received" not in text and text.count("not applicable (report.md)") == 2, text


# --- 4. SSIM on [0, 1] pixels --------------------------------------------------------------------


def test_ssim_is_computed_on_pixels_with_data_range_one() -> None:
    rng = np.random.default_rng(0)
    pixels = rng.random((6, 1, 8, 8)) ** 2  # [0, 1], darker than grey, as digits are
    mean, std = float(pixels.mean()), float(pixels.std())
    truth = ((pixels - mean) / std).astype(np.float32)
    rebuilt = np.broadcast_to(truth.mean(0), truth.shape).copy()  # the mean-image prior
    labels = np.array([0, 0, 0, 1, 1, 1])
    scores = image_scores(truth, rebuilt, labels, (mean, std))
    back = np.clip(rebuilt * std + mean, 0, 1)
    expected = [structural_similarity(p, r, data_range=1.0, win_size=7, channel_axis=0)
                for p, r in zip(pixels, back, strict=True)]
    assert scores["ssim"] == pytest.approx((np.mean(expected[:3]) + np.mean(expected[3:])) / 2, abs=1e-6)
    assert scores["data_range"] == 1.0
    standardised = scores["ssim_standardised"]  # what splitleak reported before: a diagnostic
    assert standardised["data_range"] == pytest.approx(float(truth.max() - truth.min()))
    assert standardised["ssim"] != pytest.approx(scores["ssim"], abs=0.01)


def test_a_party_keeps_how_its_pixels_were_scaled(tmp_path: Path) -> None:
    from splitleak.config import parse_config
    from splitleak.datasets import build_dataset
    from splitleak.datasets.digits import digit_images
    from splitleak.inputs import load_party_inputs
    from tests.conftest import small_config

    cfg = parse_config(small_config(tmp_path, dataset={"name": "digits"},
                                    features={"passive": [[0, 4], [4, 8]]}))
    inputs = load_party_inputs(cfg, build_dataset("digits", {}), (0, 4))
    mean, std = inputs.pixel_scale
    np.testing.assert_allclose(inputs.numeric.numpy() * std + mean, digit_images()[..., :4], atol=1e-6)


# --- 5. EXACT: exact ties counted, broken by a seeded draw, F1 with ties wrong and right --------


def test_exact_counts_ties_and_draws_among_them() -> None:
    """Feature 1's values 0 and 1 share one embedding: their candidates' gradients are equal, so
    every row whose value is 0 or 1 is an exact tie between the two."""
    g = torch.Generator().manual_seed(0)
    cfg = ModelConfig(kind="mlp", layers=[6, 5], cut_layer=1, embedding_dim=2)
    top = build_top(cfg, [(6,)], InputSpec(1, (2, 3, 4)), outputs=1, seed=4)
    for p in top.parameters():
        p.data.normal_(0, 0.5, generator=g)
    table = top.own_bottom.encoder.embeddings[1].weight
    table.data[1] = table.data[0]
    batch = 40
    h, numeric = torch.randn(batch, 6, generator=g), torch.randn(batch, 1, generator=g)
    cats = torch.stack([torch.randint(0, 2, (batch,), generator=g),
                        torch.randint(0, 3, (batch,), generator=g),
                        torch.randint(0, 4, (batch,), generator=g)], dim=1)
    y = torch.randint(0, 2, (batch,), generator=g)
    h_ = h.clone().requires_grad_(True)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(top([h_], numeric, cats)[:, 0], y.float())
    received = torch.autograd.grad(loss, h_)[0]
    candidates = Candidates.enumerate([3, 4], (1, 2), labels=2)
    found = reconstruct(top, h, received, numeric, cats, candidates,
                        generator=np.random.default_rng(1))
    tied_rows = np.flatnonzero(cats[:, 1].numpy() < 2)
    assert sorted(found.ties) == tied_rows.tolist()
    for row in tied_rows:
        tied_labels, tied_codes = found.ties[row]
        assert sorted(tied_codes[:, 0].tolist()) == [0, 1] and set(tied_labels) == {int(y[row])}
    picked = found.codes[tied_rows, 0]
    assert set(picked.tolist()) == {0, 1}  # a draw, not the first candidate in enumeration order
    again = reconstruct(top, h, received, numeric, cats, candidates, generator=np.random.default_rng(1))
    np.testing.assert_array_equal(again.codes, found.codes)  # seeded
    np.testing.assert_array_equal(found.labels, y.numpy())

    own = OwnColumns((), ("C0", "C1", "C2"), (2, 3, 4), (1, 2))
    result = _scores(own, candidates, [found], y.numpy(), cats[:, 1:].numpy())
    ties = result.figures["ties"]
    assert ties["rows"] == tied_rows.size and ties["of"] == batch
    assert ties["right"]["feature_f1"]["C1"] == 1.0 and ties["right"]["label_f1"] == 1.0
    assert ties["wrong"]["feature_f1"]["C1"] < result.figures["feature_f1"]["C1"] < 1.0
    assert ties["wrong"]["label_f1"] == 1.0  # the tied candidates agree on the label


def test_settling_ties_against_the_truth() -> None:
    answer = np.array([[1, 0], [0, 2]])
    truth = np.array([[1, 1], [0, 2]])
    ties = {0: np.array([[1, 0], [1, 1]])}  # row 0: label 1 either way, feature 0 or 1
    np.testing.assert_array_equal(settle_ties(answer, truth, ties, right=True), [[1, 1], [0, 2]])
    np.testing.assert_array_equal(settle_ties(answer, truth, ties, right=False), [[1, 0], [0, 2]])


# --- helpers -------------------------------------------------------------------------------------


def _entry(summary: dict, attack: str, layer: str) -> dict:
    return next(e for e in summary["leak"] if e["scope"] == "run" and e["attack"] == attack
                and e["layer"] == layer and e["parties"] == [1])


def _binary_run(root: Path, defense: bool, steps: int = 4, rows: int = 24) -> RunDir:
    """A binary run's gradient log (cut and first layer), its labels and config, no artifact."""
    import pyarrow as pa

    run = RunDir(root)
    run.label_party.mkdir(parents=True)
    chain = '\n[[defense]]\nname = "marvell"\ns = 4.0\n' if defense else ""
    run.config.write_text(f"[run]\nseed = 5\n{chain}")
    rng = np.random.default_rng(0)
    labels = (np.arange(rows * steps) % 4 == 0).astype(np.int64)
    pq.write_table(pa.table({"sample_id": np.arange(labels.size), "label": labels,
                             "split": ["train"] * labels.size}), run.labels)
    store = GradientStore(run.attacker / "gradients", "synthetic")
    for step in range(steps):
        ids = np.arange(step * rows, (step + 1) * rows)
        signal = (2.0 * labels[ids] - 1.0)[:, None]
        store.append(1, 0, step, ids, {
            "cut_gradient": (signal + rng.standard_normal((rows, 8))).astype(np.float32),
            "first_layer_gradient": (signal + rng.standard_normal((rows, 5))).astype(np.float32)})
    store.close()
    return run
