"""Model completion: MixMatch's pieces against hand computations, and the attack on a real run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attacker.analysis.analyze import analyze
from attacker.attacks import RunContext, build_attack
from attacker.attacks.completion.engine import top_k_correct
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
from orchestration.reference import run_reference
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import parse_config
from tests.conftest import small_config

# --- MixMatch's pieces --------------------------------------------------------------------------


def test_sharpen_by_hand() -> None:
    # T = 0.5 squares: (0.36, 0.16) / 0.52 and (0.25, 0.25) / 0.5
    sharp = sharpen(torch.tensor([[0.6, 0.4], [0.5, 0.5]]), 0.5)
    torch.testing.assert_close(sharp, torch.tensor([[0.36 / 0.52, 0.16 / 0.52], [0.5, 0.5]]))
    # T = 0.8 (MixMatch): 0.9^1.25 / (0.9^1.25 + 0.1^1.25)
    high = 0.9 ** 1.25 / (0.9 ** 1.25 + 0.1 ** 1.25)
    torch.testing.assert_close(sharpen(torch.tensor([[0.9, 0.1]]), 0.8),
                               torch.tensor([[high, 1 - high]]))
    assert high > 0.9  # sharper than the guess


class _FixedBeta:
    def __init__(self, value: float) -> None:
        self.value = value

    def beta(self, a: float, b: float) -> float:
        assert a == b == 0.75
        return self.value


def test_mixup_weight_keeps_the_larger_share() -> None:
    assert mixup_weight(_FixedBeta(0.3), 0.75) == pytest.approx(0.7)  # type: ignore[arg-type]
    assert mixup_weight(_FixedBeta(0.8), 0.75) == pytest.approx(0.8)  # type: ignore[arg-type]
    draws = [mixup_weight(np.random.default_rng(s), 0.75) for s in range(200)]
    assert min(draws) >= 0.5 and max(draws) <= 1.0


def test_mixup_by_hand() -> None:
    rows = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    mixed = mixup(rows, torch.tensor([1, 0, 2]), 0.75)
    torch.testing.assert_close(mixed, torch.tensor([[0.75, 0.25], [0.25, 0.75], [2.0, 2.0]]))


def test_linear_rampup() -> None:
    assert linear_rampup(5, 10) == 0.5 and linear_rampup(0, 10) == 0.0
    assert linear_rampup(20, 10) == 1.0 and linear_rampup(3, 0) == 1.0


def test_semi_supervised_loss_by_hand() -> None:
    # L_x: logits (0, 0) against (1, 0) is log 2; L_u: softmax (0.5, 0.5) against (1, 0) has
    # squared errors 0.25 and 0.25, mean 0.25; logits (log 3, 0) -> (0.75, 0.25) against (0.5, 0.5):
    # errors 0.0625 twice. Mean over both rows and classes: 0.15625.
    loss_x, loss_u = semi_supervised_loss(
        torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]),
        torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]]), torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
    assert loss_x.item() == pytest.approx(math.log(2.0))
    assert loss_u.item() == pytest.approx(0.15625)


def test_ema_update_by_hand() -> None:
    average, value = torch.tensor([1.0, 10.0]), torch.tensor([3.0, 0.0])
    ema_update([average], [value], 0.9)
    torch.testing.assert_close(average, torch.tensor([1.2, 9.0]))
    ema_update([average], [value], 0.0)  # decay 0 copies
    torch.testing.assert_close(average, value)


def test_debiased_ema_by_hand() -> None:
    # From zero, two updates with decay 0.9 of 10 then 20: a = 0.1 * 10 = 1, then
    # 0.9 * 1 + 0.1 * 20 = 2.9; debiased by 1 - 0.81 = 0.19: 2.9 / 0.19 = (0.9*10 + 20) / 1.9
    average = torch.zeros(1)
    for value in (10.0, 20.0):
        ema_update([average], [torch.tensor([value])], 0.9)
    torch.testing.assert_close(debiased(average, 0.9, 2), torch.tensor([(9.0 + 20.0) / 1.9]))
    constant = torch.zeros(1)
    for _ in range(3):
        ema_update([constant], [torch.tensor([5.0])], 0.999)
    torch.testing.assert_close(debiased(constant, 0.999, 3), torch.tensor([5.0]))  # no pull to 0
    assert debiased(average, 0.9, 0) is average


def test_shift_images_translates_without_changing_the_digit() -> None:
    image = torch.zeros(64, 1, 7, 5)
    image[:, 0, 3, 2] = 1.0  # one lit pixel in the middle
    moved = shift_images(image, 2, torch.Generator().manual_seed(0))
    assert moved.shape == image.shape
    lit = moved[:, 0].flatten(1).argmax(1)
    rows, cols = lit // 5, lit % 5
    assert torch.all(moved.flatten(1).sum(1) == 1.0)  # the pixel is moved, never lost or doubled
    assert torch.all((rows - 3).abs() <= 2) and torch.all((cols - 2).abs() <= 2)
    assert len(set(zip(rows.tolist(), cols.tolist(), strict=True))) > 10  # shifts differ per image
    torch.testing.assert_close(shift_images(image, 0, torch.Generator()), image)
    again = shift_images(image, 2, torch.Generator().manual_seed(0))
    torch.testing.assert_close(again, moved)


def test_jitter_is_gaussian_noise_on_numerics() -> None:
    numeric = torch.zeros(20000, 3)
    noisy = jitter(numeric, 0.1, torch.Generator().manual_seed(1))
    assert abs(noisy.std().item() - 0.1) < 0.005 and abs(noisy.mean().item()) < 0.005
    assert jitter(numeric, 0.0, torch.Generator()) is numeric


def test_top_k_correct() -> None:
    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.5], [0.2, 0.3, 0.4]])
    truth = np.array([1, 2, 0])
    assert top_k_correct(logits, truth, 1) == 1 and top_k_correct(logits, truth, 2) == 2
    assert top_k_correct(logits, truth, 5) == 3


# --- the attack on a run directory ----------------------------------------------------------


def _digits_run(tmp_path: Path, **threat: object) -> RunDir:
    data = small_config(tmp_path, dataset={"name": "digits", "test_fraction": 0.25},
                        features={"passive": [[0, 4], [4, 8]]},
                        model={"kind": "mlp", "layers": [16, 16], "cut_layer": 2},
                        training={"batch_size": 64, "epochs": 2, "eval_interval": 0},
                        threat={"parties": {"1": {"labelled_per_class": 2, **threat}}})
    cfg = parse_config(data)
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    return run


def _context(run: RunDir, parties: tuple[int, ...] = (1,), seed: int = 0) -> RunContext:
    import pyarrow.parquet as pq

    from splitleak.config import load_config

    table = pq.read_table(run.labels).to_pydict()
    ids, labels, split = (np.array(table[c]) for c in ("sample_id", "label", "split"))
    lookup = np.full(ids.max() + 1, -1)
    lookup[ids] = labels
    return RunContext(run, load_config(run.config), parties, seed, np.sort(ids[split == "train"]),
                      np.sort(ids[split == "test"]), lookup)


def test_model_completion_on_a_run_is_deterministic_and_excludes_its_labelled_rows(
        tmp_path: Path) -> None:
    run = _digits_run(tmp_path)
    attack = build_attack("model_completion", {"labelled_per_class": 2, "steps": 40, "batch_size": 8})
    assert attack.label == "model_completion(labelled_per_class=2, steps=40, batch_size=8)"
    without = build_attack("model_completion", {"labelled_per_class": 2, "steps": 40, "batch_size": 8,
                                                "baselines": False})
    assert without.label == attack.label  # the same attack, without the reference figures
    context = _context(run)
    result = attack.run(context)
    figures = result.figures
    assert figures["labelled"] == 20 and context.labelled.size == 20  # 2 per class, 10 classes
    train_rows = context.train_ids.size - 20
    assert figures["train"]["rows"] == train_rows and result.rows == train_rows
    assert figures["test"]["rows"] == context.test_ids.size
    assert not np.isin(context.labelled, context.test_ids).any()
    for split in ("train", "test"):  # ten classes: top-5 too, and it is at least top-1
        assert 0.0 <= figures[split]["top1"] <= figures[split]["top5"] <= 1.0
    assert set(figures["baselines"]) == {"labelled_only", "random_bottom"}
    quick = build_attack("model_completion", {"labelled_per_class": 2, "steps": 40, "batch_size": 8,
                                              "baselines": False})
    again = quick.run(_context(run))  # the same seed: the same rows, training and accuracies
    assert again.figures["train"] == figures["train"] and again.figures["test"] == figures["test"]
    other_context = _context(run, seed=1)  # another side-knowledge seed draws other rows
    quick.run(other_context)
    assert other_context.labelled.size == 20
    assert not np.array_equal(other_context.labelled, context.labelled)


def test_analyze_runs_model_completion_from_the_threat_model(tmp_path: Path) -> None:
    run = _digits_run(tmp_path)
    # a named list is what runs; the warning says what the threat model would add and how
    summary = analyze(run.root, [("direct_label", {})])
    assert not [e for e in summary["leak"] if e["layer"] == "bottom"]
    assert ("--attacks names the attacks to run, so the threat model's run-level attack "
            "model_completion (party 1) will not run; add 'model_completion' to --attacks"
            in " ".join(summary["warnings"]))
    summary = analyze(run.root, [("direct_label", {}),
                                 ("model_completion", {"steps": 20, "baselines": False})])
    entry = next(e for e in summary["leak"] if e["layer"] == "bottom")
    assert entry["parties"] == [1] and entry["threat"] == "curious, honest"
    assert entry["pooled"]["accuracy"] == entry["completion"]["train"]["top1"]
    assert "baselines" not in entry["completion"]
    # a party whose bottom model is missing: a warning and an entry saying why, not a crash
    run.bottom_model(1).unlink()
    summary = analyze(run.root, [("model_completion", {"steps": 20})])
    entry = next(e for e in summary["leak"] if e["layer"] == "bottom")
    assert "bottom.pt" in entry["error"] and any("bottom.pt" in w for w in summary["warnings"])


def test_two_analyses_with_model_completion_write_the_same_bytes_and_time_it_apart(
        tmp_path: Path) -> None:
    from attacker.cli import main as attacker_main

    run = _digits_run(tmp_path)
    written = []
    for _ in range(2):
        assert attacker_main(["analyze", str(run.root), "--jobs", "1", "--attacks", "direct_label",
                              "model_completion:steps=20"]) == 0
        written.append((run.leak_summary.read_bytes(), run.report_md.read_bytes()))
        timing = json.loads((run.report / "timing.json").read_text())
        (entry,) = timing["run_attacks"]
        assert entry["attack"].startswith("model_completion") and entry["parties"] == [1]
        assert entry["cpu_seconds"] > 0 and len(entry["fit_cpu_seconds"]) == 3
    assert written[0] == written[1]
    assert b"seconds" not in written[0][0] and b"CPU s" not in written[0][1]


def test_a_batch_of_one_row_is_refused_naming_the_bound() -> None:
    """batch_size = 1 was accepted, then every training failed on the head's BatchNorm (the
    attack skipped with PyTorch's "Expected more than 1 value per channel"): its bound is 2."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="greater than or equal to 2"):
        build_attack("model_completion", {"batch_size": 1})
    assert build_attack("model_completion", {"batch_size": 2}).params.batch_size == 2


def test_a_diverged_completion_is_skipped_not_scored(tmp_path: Path) -> None:
    """lr = 1e30 (its only bound is > 0) left NaN weights whose argmax labels every row 0, and
    the attack reported that as its accuracy (0.090 train on digits); it now says it diverged."""
    run = _digits_run(tmp_path)
    attack = build_attack("model_completion", {"labelled_per_class": 2, "steps": 5, "batch_size": 8,
                                               "lr": 1e30, "baselines": False})
    with pytest.raises(ValueError, match=r"model completion diverged: its model gives NaN or "
                                         r"infinite logits after 5 steps at lr = 1e\+30"):
        attack.run(_context(run))
