"""Known-answer and conformance tests for the label-inference attacks and the leak metrics."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score

from attacker.analysis.leak import (
    BatchLeak,
    LeakAUC,
    attack_rng,
    auc_bound_from_sumkl,
    detection_error_lower_bound,
    evaluate_batch,
    label_accuracy,
    leak_auc,
    pooled_accuracy,
    summarise,
)
from attacker.analysis.summary import summarise_leak
from attacker.attacks import (
    ATTACKS,
    DEFAULT_ATTACKS,
    DEFAULT_MULTICLASS_ATTACKS,
    FAMILIES,
    NO_PREDICTION,
    RUN_ATTACKS,
    Attack,
    AttackResult,
    RunAttack,
    SideKnowledge,
    build_attack,
)

BINARY_DEFAULTS = [
    pytest.param(name, params, id=f"{name}-{params}") for name, params in DEFAULT_ATTACKS
]


def separable_batch(
    n_pos: int = 40, n_neg: int = 160, dim: int = 16, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Positives point along -v with norms in [4, 5]; negatives along +v with norms in [1, 2].

    Small noise orthogonal to v keeps rows distinct. Every attack in DEFAULT_ATTACKS separates
    these classes perfectly.
    """
    rng = np.random.default_rng(seed)
    direction = np.zeros(dim)
    direction[0] = 1.0
    noise = 0.05 * rng.standard_normal((n_pos + n_neg, dim))
    noise[:, 0] = 0.0
    scale = np.concatenate([-rng.uniform(4, 5, n_pos), rng.uniform(1, 2, n_neg)])
    gradients = scale[:, None] * direction + noise
    labels = np.concatenate([np.ones(n_pos, dtype=np.int64), np.zeros(n_neg, dtype=np.int64)])
    order = rng.permutation(labels.size)
    return gradients[order].astype(np.float32), labels[order]


def no_side(n_rows: int) -> SideKnowledge:
    return SideKnowledge(np.zeros(n_rows, dtype=np.int64), np.random.default_rng(0))


def evaluate(name: str, params: dict, gradients: np.ndarray, labels: np.ndarray, seed: int = 0):
    return evaluate_batch(
        build_attack(name, params), gradients, labels, np.random.default_rng(seed)
    )


# --- known answers ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "params"), BINARY_DEFAULTS)
def test_separable_batch_gives_auc_one(name: str, params: dict) -> None:
    gradients, labels = separable_batch()
    leak = evaluate(name, params, gradients, labels)
    assert leak.auc is not None, leak.skip_reason
    assert leak.auc.raw == 1.0


@pytest.mark.parametrize(("name", "params"), BINARY_DEFAULTS)
def test_identical_class_distributions_give_auc_near_half(name: str, params: dict) -> None:
    # 4000 rows, 50 % positives: the AUC's standard error is ~0.009, so 0.05 is > 5 sigma.
    rng = np.random.default_rng(7)
    gradients = rng.standard_normal((4000, 8)).astype(np.float32)
    labels = rng.integers(0, 2, 4000)
    leak = evaluate(name, params, gradients, labels)
    assert leak.auc is not None, leak.skip_reason
    assert abs(leak.auc.raw - 0.5) < 0.05


def test_norm_ranks_larger_norms_as_positive() -> None:
    gradients = np.array([[3.0, 4.0], [0.0, 1.0], [0.0, 0.0]], dtype=np.float32)
    result = build_attack("norm", {})(gradients, no_side(3))
    np.testing.assert_allclose(result.values, [5.0, 1.0, 0.0])
    assert not result.exclude.any()


def test_inverted_scores_flip() -> None:
    gradients, labels = separable_batch()
    # g / ||g||^2 has norm 1 / ||g||: positives now have the smaller norms, every pair is
    # ranked backwards.
    inverted = gradients / np.sum(gradients.astype(np.float64) ** 2, axis=1, keepdims=True)
    leak = evaluate("norm", {}, inverted.astype(np.float32), labels)
    assert leak.auc is not None
    assert leak.auc.raw == pytest.approx(0.0)
    assert leak.auc.flipped == pytest.approx(1.0)
    scores = np.linalg.norm(gradients, axis=1)
    assert leak_auc(-scores, labels).raw == 0.0
    assert leak_auc(-scores, labels).flipped == 1.0


def test_cosine_majority_scores_the_minority_higher() -> None:
    # 3 rows along +e0, 7 along -e0 (plus tiny distinct noise): the 3 agree with 2 others each,
    # the 7 with 6 each, so the minority gets the higher score.
    rng = np.random.default_rng(1)
    gradients = np.concatenate([np.tile([1.0, 0.0], (3, 1)), np.tile([-1.0, 0.0], (7, 1))])
    gradients[:, 1] = 0.01 * rng.standard_normal(10)
    result = build_attack("cosine_majority", {})(gradients.astype(np.float32), no_side(10))
    np.testing.assert_array_equal(result.values, [-2.0] * 3 + [-6.0] * 7)


def test_cosine_majority_ignores_zero_rows() -> None:
    gradients = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 0.0], [-1.0, 0.0]], dtype=np.float32)
    result = build_attack("cosine_majority", {})(gradients, no_side(len(gradients)))
    np.testing.assert_array_equal(result.values, [-1.0, -1.0, 0.0, 0.0])


def test_cosine_majority_handles_tiny_gradients() -> None:
    # Raw float32 inner products of these rows underflow to zero; the cosines do not.
    gradients = np.array([[1e-25, 0.0], [1e-25, 1e-26], [-1e-25, 0.0]], dtype=np.float32)
    result = build_attack("cosine_majority", {})(gradients, no_side(len(gradients)))
    np.testing.assert_array_equal(result.values, [-1.0, -1.0, 0.0])


def test_cosine_oracle_scores_cosine_with_the_picked_positive() -> None:
    gradients = np.array([[2.0, 0.0], [0.0, 3.0], [-1.0, 0.0], [1.0, 1.0]], dtype=np.float32)
    labels = np.array([1, 0, 0, 0])
    result = build_attack("cosine_oracle", {})(
        gradients, SideKnowledge(labels, np.random.default_rng(0))
    )
    np.testing.assert_allclose(result.values, [1.0, 0.0, -1.0, math.sqrt(0.5)])
    np.testing.assert_array_equal(result.exclude, [True, False, False, False])


def test_hint_distance_uses_the_nearest_hint() -> None:
    gradients = np.array([[0.0, 0.0], [10.0, 0.0], [1.0, 0.0], [9.0, 0.0], [5.0, 0.0]])
    labels = np.array([1, 1, 0, 0, 0])
    side = SideKnowledge(labels, np.random.default_rng(0))
    result = build_attack("hint_distance", {"k": 2})(gradients.astype(np.float32), side)
    np.testing.assert_allclose(result.values, [0.0, 0.0, -1.0, -1.0, -5.0])
    np.testing.assert_array_equal(result.exclude, [True, True, False, False, False])


def test_hint_inner_uses_the_largest_hint() -> None:
    gradients = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0], [1.0, 1.0]], dtype=np.float32)
    labels = np.array([1, 1, 0, 0])
    side = SideKnowledge(labels, np.random.default_rng(0))
    result = build_attack("hint_inner", {"k": 2})(gradients, side)
    np.testing.assert_allclose(result.values[2:], [8.0, 2.0])  # projections on h* = (0, 2)
    np.testing.assert_array_equal(result.exclude, [True, True, False, False])


def test_mean_and_median_oracle_centers() -> None:
    # Class 0 rows 0, 1, 5 (mean 2, median 1); class 1 rows 10, 11, 30 (mean 17, median 11).
    gradients = np.array([[0.0], [1.0], [5.0], [10.0], [11.0], [30.0]], dtype=np.float32)
    labels = np.array([0, 0, 0, 1, 1, 1])
    mean = build_attack("mean", {"centers": "oracle"})(gradients, SideKnowledge(labels, None))
    median = build_attack("median", {"centers": "oracle"})(gradients, SideKnowledge(labels, None))
    x = gradients[:, 0].astype(np.float64)
    np.testing.assert_allclose(mean.values, np.abs(x - 2) - np.abs(x - 17), atol=1e-9)
    np.testing.assert_allclose(median.values, np.abs(x - 1) - np.abs(x - 11), atol=1e-9)
    assert not mean.exclude.any() and not median.exclude.any()


def test_leave_one_out_centers_leave_the_scored_row_out_of_its_class() -> None:
    # Class 0 rows 0, 1, 5, 6; class 1 rows 10, 11, 30. Row 5 without itself: class-0 mean
    # 7/3 and median 1; class 1 is whole (mean 17, median 11).
    gradients = np.array([[0.0], [1.0], [5.0], [6.0], [10.0], [11.0], [30.0]], dtype=np.float32)
    labels = np.array([0, 0, 0, 0, 1, 1, 1])
    mean = build_attack("mean", {"centers": "oracle_loo"})(gradients, SideKnowledge(labels, None))
    median = build_attack("median", {"centers": "oracle_loo"})(gradients, SideKnowledge(labels, None))
    assert mean.values[2] == pytest.approx(abs(5 - 7 / 3) - abs(5 - 17))
    assert median.values[2] == pytest.approx(abs(5 - 1) - abs(5 - 11))
    assert median.values[4] == pytest.approx(abs(10 - 3) - abs(10 - 20.5))  # class 1 without 10
    assert not mean.exclude.any() and not median.exclude.any()


@pytest.mark.parametrize("name", ["mean", "median"])
@pytest.mark.parametrize("n_rows", [5, 8, 65])
def test_leave_one_out_centers_equal_centers_recomputed_without_each_row(name: str, n_rows: int) -> None:
    rng = np.random.default_rng(n_rows)
    gradients = rng.normal(size=(n_rows, 6)).astype(np.float32)
    gradients[:, 0] = np.round(gradients[:, 0])  # ties in a coordinate
    gradients[:, 1] = rng.integers(0, 2, n_rows)  # mostly ties
    labels = np.array([0, 1, 0, 1, *rng.integers(0, 2, n_rows - 4)])
    center = {"mean": lambda r: r.mean(axis=0), "median": lambda r: np.median(r, axis=0)}[name]
    rows = gradients.astype(np.float64)
    expected = []
    for i in range(n_rows):
        others = np.arange(n_rows) != i
        c0, c1 = center(rows[others & (labels == 0)]), center(rows[others & (labels == 1)])
        expected.append(np.linalg.norm(rows[i] - c0) - np.linalg.norm(rows[i] - c1))
    result = build_attack(name, {"centers": "oracle_loo"})(gradients, SideKnowledge(labels, None))
    np.testing.assert_allclose(result.values, expected, rtol=0, atol=1e-12)
    if name == "median":  # the same order statistics np.median picks: equal, not close
        np.testing.assert_array_equal(result.values, expected)


def test_oracle_centers_see_the_scored_label_and_leave_one_out_does_not() -> None:
    """On pure noise a row's own gradient in its class's center ranks it: the oracle variant is
    an upper bound far above chance; leave-one-out is at chance."""
    rng = np.random.default_rng(0)
    auc: dict[str, list[float]] = {"oracle": [], "oracle_loo": []}
    for _ in range(20):  # mean AUC over 20 batches of 256: chance is 0.5 ± 0.01
        gradients, labels = rng.normal(size=(256, 64)), rng.integers(0, 2, 256)
        for centers, values in auc.items():
            values.append(roc_auc_score(labels, build_attack("mean", {"centers": centers})(
                gradients, SideKnowledge(labels, None)).values))
    assert np.mean(auc["oracle"]) > 0.7 and abs(np.mean(auc["oracle_loo"]) - 0.5) < 0.04
    assert build_attack("mean", {"centers": "oracle"}).sees_scored_label
    assert not build_attack("mean", {"centers": "oracle_loo"}).sees_scored_label
    assert not build_attack("median", {"centers": "hint"}).sees_scored_label
    assert build_attack("median", {"centers": "oracle_loo"}).label == "median(centers=oracle_loo)"


def test_leave_one_out_needs_two_rows_of_each_class() -> None:
    gradients = np.arange(10, dtype=np.float32).reshape(5, 2)
    labels = np.array([0, 0, 0, 0, 1])  # one positive: its class has no center without it
    result = build_attack("mean", {"centers": "oracle_loo"})(gradients, SideKnowledge(labels, None))
    assert result.skip_reason == ("1 positive row(s): leave-one-out centers need two rows of "
                                  "each class")  # it said "side knowledge unusable (0 row(s)
    # revealed)", though this attack is told every label
    leak = evaluate("median", {"centers": "oracle_loo"}, gradients[:3], np.array([0, 1, 1]))
    assert leak.skipped and leak.skip_reason == ("1 negative row(s): leave-one-out centers need "
                                                 "two rows of each class")


@pytest.mark.parametrize("name", ["mean", "median"])
def test_hint_centers_reveal_both_classes_and_exclude_them(name: str) -> None:
    gradients, labels = separable_batch(n_pos=20, n_neg=380)
    side = SideKnowledge(labels, np.random.default_rng(3))
    result = build_attack(name, {"centers": "hint", "hints": 5})(gradients, side)
    revealed = labels[result.exclude]
    assert np.count_nonzero(revealed == 1) >= 5 and np.count_nonzero(revealed == 0) >= 5
    np.testing.assert_array_equal(result.exclude, side.used)
    assert result.exclude.sum() <= 200 + 10  # about half the batch at most


def test_direct_label_reads_a_binary_runs_one_bce_logit() -> None:
    """A binary run without a top model sends the 1-wide BCE gradient σ(z) - y: negative exactly
    for the positives. The first-negative-coordinate rule labelled every row 0 (accuracy 0.0)."""
    z = torch.randn(32, 1, requires_grad=True, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(32) % 2
    torch.nn.functional.binary_cross_entropy_with_logits(z[:, 0], labels.float()).backward()
    result = build_attack("direct_label", {})(z.grad.numpy(), SideKnowledge(labels.numpy(), None))
    np.testing.assert_array_equal(result.values, labels.numpy())


def test_direct_label_recovers_softmax_ce_labels() -> None:
    rng = np.random.default_rng(5)
    logits = 3.0 * rng.standard_normal((500, 10))
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    labels = rng.integers(0, 10, 500)
    gradients = (probs - np.eye(10)[labels]).astype(np.float32)
    leak = evaluate("direct_label", {}, gradients, labels)
    assert leak.metric == "accuracy" and leak.accuracy == 1.0


def test_direct_label_row_without_negative_is_skipped_and_counted() -> None:
    # Fu et al. count a row with no negative coordinate neither right nor wrong.
    gradients = np.array([[0.2, -0.3, 0.1], [0.0, 0.0, 0.0], [0.5, 0.0, 0.5], [-0.1, 0.05, 0.05]],
                         dtype=np.float32)
    labels = np.array([1, 0, 2, 2])
    result = build_attack("direct_label", {})(gradients, no_side(4))
    np.testing.assert_array_equal(result.values, [1, NO_PREDICTION, NO_PREDICTION, 0])
    assert label_accuracy(result.values, labels) == pytest.approx(1 / 2)
    leak = evaluate("direct_label", {}, gradients, labels)
    assert (leak.n_correct, leak.n_predicted, leak.n_no_prediction) == (1, 2, 2)
    assert leak.accuracy == pytest.approx(1 / 2)
    none = evaluate("direct_label", {}, np.zeros((3, 3), dtype=np.float32), np.array([0, 1, 2]))
    assert none.skip_kind == "no_prediction" and none.n_no_prediction == 3


def test_pooled_accuracy_weighs_rows_not_batches() -> None:
    # A full batch of 8 rows all right, then a 2-row last batch all wrong: the mean over batches
    # is 0.5, but 8 of 10 rows are right.
    eye = np.eye(3, dtype=np.float32)
    full = evaluate("direct_label", {}, -eye[np.zeros(8, dtype=int)], np.zeros(8, dtype=np.int64))
    last = evaluate("direct_label", {}, -eye[np.zeros(2, dtype=int)], np.ones(2, dtype=np.int64))
    assert (full.accuracy, last.accuracy) == (1.0, 0.0)
    rows = [_leak_row(step, leak) for step, leak in enumerate((full, last))]
    entry = next(e for e in summarise_leak(rows) if e["scope"] == "run")
    assert entry["accuracy"]["mean"] == pytest.approx(0.5)
    assert entry["pooled"] == {"accuracy": pytest.approx(0.8), "correct": 8, "rows": 10,
                               "no_prediction": 0}
    assert pooled_accuracy([8, 0], [8, 2]) == pytest.approx(0.8)
    assert pooled_accuracy([], []) is None


# --- skipping and exclusion ------------------------------------------------------------------


def _leak_row(step: int, leak: BatchLeak, draw: int = 0) -> dict:
    return {"party_id": 1, "parties": "1", "layer": "cut", "epoch": 0, "step": step,
            "attack": leak.attack, "name": leak.attack, "side_knowledge": "s", "metric": leak.metric,
            "auc_raw": leak.auc.raw if leak.auc else None,
            "auc_flipped": leak.auc.flipped if leak.auc else None, "accuracy": leak.accuracy,
            "n_rows": leak.n_rows, "n_excluded": leak.n_excluded, "n_pos": None,
            "skip_reason": leak.skip_reason, "seed": 0, "draw": draw, "skip_kind": leak.skip_kind,
            "n_correct": leak.n_correct, "n_predicted": leak.n_predicted,
            "n_no_prediction": leak.n_no_prediction}


@pytest.mark.parametrize("name", ["median", "mean", "norm", "cosine_majority"])
def test_tied_batch_is_skipped_as_degenerate_never_scored_half(name: str) -> None:
    # First-layer gradients after a dead ReLU: every row zero, so both class medians are the zero
    # vector and every score ties. That carries no information: skipped and counted.
    labels = np.array([0, 1, 0, 1, 1, 0, 0, 0])
    params = {"centers": "oracle"} if name in ("mean", "median") else {}
    leak = evaluate(name, params, np.zeros((8, 5), dtype=np.float32), labels)
    assert leak.auc is None and leak.skip_kind == "degenerate"
    assert leak.skip_reason.startswith("degenerate: all 8 scores tied")
    scored = evaluate(name, params, *separable_batch())
    entry = next(e for e in summarise_leak([_leak_row(0, leak), _leak_row(1, scored)])
                 if e["scope"] == "run")
    assert (entry["batches"], entry["skipped"], entry["degenerate"]) == (2, 1, 1)
    assert entry["flipped"]["n"] == 1 and entry["flipped"]["mean"] == 1.0  # never a 0.5 in it


def test_empty_attack_input_is_skipped() -> None:
    leak = evaluate("norm", {}, np.zeros((4, 0), dtype=np.float32), np.array([0, 1, 0, 1]))
    assert leak.skip_kind == "empty" and "d = 0" in leak.skip_reason


def test_cosine_oracle_uses_the_clean_anchor_when_given() -> None:
    # Received rows are noised; the clean gradient of row 0 points along +e0. The score is the
    # cosine with the clean anchor, not with the received row 0.
    received = np.array([[0.0, 5.0], [1.0, 0.0], [-1.0, 0.0], [1.0, 1.0]], dtype=np.float32)
    labels = np.array([1, 1, 0, 0])
    attack = build_attack("cosine_oracle", {})
    clean = attack(received, SideKnowledge(labels, np.random.default_rng(0),
                                           clean_anchor=(0, np.array([2.0, 0.0], dtype=np.float32))))
    np.testing.assert_allclose(clean.values[1:], [1.0, -1.0, math.sqrt(0.5)])
    np.testing.assert_array_equal(clean.exclude, [True, False, False, False])
    leak = evaluate_batch(attack, received, labels, np.random.default_rng(0),
                          (0, np.array([2.0, 0.0], dtype=np.float32)))
    assert leak.auc.raw == 1.0 and leak.n_excluded == 1
    side = SideKnowledge(labels, np.random.default_rng(0), clean_anchor=None)
    row, gradient = side.clean_positive()
    assert labels[row] == 1 and gradient is None and side.used[row]  # no artifact: received row


def test_spread_over_draws_of_random_side_knowledge() -> None:
    # Two draws of a hint attack over three batches: draw 0 scores 0.6, 0.7, 0.8 and draw 1
    # scores 0.8, 0.9, 1.0. Each number is the mean over draws; the spread is across draws.
    rows = []
    for draw, values in enumerate(((0.6, 0.7, 0.8), (0.8, 0.9, 1.0))):
        for step, value in enumerate(values):
            leak = BatchLeak("hint_distance(k=1)", "auc", 10, 1, auc=LeakAUC(value, value, 9, 3))
            rows.append(_leak_row(step, leak, draw))
    entry = next(e for e in summarise_leak(rows) if e["scope"] == "run")
    assert entry["draws"] == 2 and entry["batches"] == 3 and entry["flipped"]["n"] == 3
    assert entry["flipped"]["mean"] == pytest.approx(0.8)  # (0.7 + 0.9) / 2
    p95 = (np.percentile([0.6, 0.7, 0.8], 95) + np.percentile([0.8, 0.9, 1.0], 95)) / 2
    assert entry["flipped"]["p95"] == pytest.approx(p95)
    assert entry["spread"]["flipped"]["mean"]["std"] == pytest.approx(np.std([0.7, 0.9], ddof=1))
    assert entry["spread"]["flipped"]["max"] == pytest.approx(
        {"std": np.std([0.8, 1.0], ddof=1), "min": 0.8, "max": 1.0})


def test_randomised_attacks_are_the_ones_drawing_side_knowledge() -> None:
    randomised = {build_attack(n, p).label for n, p in DEFAULT_ATTACKS if build_attack(n, p).randomised}
    assert randomised == {"cosine_oracle", "hint_distance(k=1)", "hint_distance(k=3)",
                          "hint_distance(k=5)", "hint_inner(k=1)", "hint_inner(k=3)",
                          "hint_inner(k=5)", "mean(centers=hint, hints=5)",
                          "median(centers=hint, hints=5)"}
    assert not build_attack("direct_label", {}).randomised


def test_single_class_batch_is_skipped_with_reason() -> None:
    gradients = np.ones((8, 4), dtype=np.float32)
    leak = evaluate("norm", {}, gradients, np.zeros(8, dtype=np.int64))
    assert leak.skipped and leak.auc is None and "single class" in leak.skip_reason
    assert leak_auc(np.arange(8.0), np.ones(8)) is None


def test_hint_taking_the_only_positive_is_skipped_with_reason() -> None:
    gradients, labels = separable_batch(n_pos=1, n_neg=20)
    leak = evaluate("hint_distance", {"k": 3}, gradients, labels)
    assert leak.skipped and leak.skip_reason.startswith("no positive left")
    assert leak.n_excluded == 1


def test_unusable_hint_labels_are_skipped_with_reason() -> None:
    # Labels are revealed 2 rows at a time up to about half of the 9 rows: with one positive,
    # the revealed labels can all be negative, and the hint-center attack then scores nothing.
    gradients, labels = separable_batch(n_pos=1, n_neg=8)
    reasons = {
        evaluate("mean", {"centers": "hint", "hints": 1}, gradients, labels, seed).skip_reason
        for seed in range(20)
    }
    assert any(reason and reason.startswith("side knowledge unusable") for reason in reasons)


def test_excluded_rows_are_left_out_of_the_auc() -> None:
    scores = np.array([0.9, 0.8, 0.1, 0.2, 0.95, 0.05])
    labels = np.array([1, 1, 0, 0, 0, 1])  # the last two rows are ranked backwards
    exclude = np.array([False, False, False, False, True, True])
    assert leak_auc(scores, labels).raw < 1.0
    auc = leak_auc(scores, labels, exclude)
    assert (auc.raw, auc.n_rows, auc.n_pos) == (1.0, 4, 2)


def test_cosine_oracle_pick_is_excluded_from_the_metric() -> None:
    gradients, labels = separable_batch()
    leak = evaluate("cosine_oracle", {}, gradients, labels)
    assert leak.n_excluded == 1 and leak.auc.n_rows == labels.size - 1
    assert leak.auc.n_pos == int(labels.sum()) - 1


class _ForgetfulHintAttack(Attack):
    """Uses a hint but reports no exclusion; deliberately not registered."""

    name = "forgetful"
    side_knowledge = "one random positive per batch"

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        hint = side.known_positives(1)
        values = np.zeros(gradients.shape[0])
        values[hint] = -1.0  # would spoil a perfect AUC if it counted
        values[side._labels == 1] += 1.0  # cheats on purpose to make the test exact
        return AttackResult(values, np.zeros(gradients.shape[0], dtype=bool))


def test_side_knowledge_rows_are_excluded_even_if_the_attack_forgets() -> None:
    gradients, labels = separable_batch()
    leak = evaluate_batch(
        _ForgetfulHintAttack(Attack.Params()), gradients, labels, np.random.default_rng(0)
    )
    assert leak.n_excluded == 1 and leak.auc.raw == 1.0


def test_score_attack_refuses_multiclass_labels() -> None:
    with pytest.raises(ValueError, match="binary"):
        evaluate("norm", {}, np.ones((3, 2), dtype=np.float32), np.array([0, 1, 2]))


# --- metrics ---------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1)), min_size=2, max_size=60).filter(
        lambda rows: len({label for _, label in rows}) == 2
    )
)
def test_leak_auc_matches_sklearn_with_ties(rows: list[tuple[int, int]]) -> None:
    scores, labels = (np.array(column) for column in zip(*rows, strict=True))
    auc = leak_auc(scores.astype(np.float64), labels)
    assert auc.raw == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert auc.flipped == pytest.approx(max(auc.raw, 1 - auc.raw))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(allow_nan=False, width=32), st.integers(0, 1)), min_size=2, max_size=60
    ).filter(lambda rows: len({label for _, label in rows}) == 2)
)
def test_leak_auc_matches_rank_formula_on_floats(rows: list[tuple[float, int]]) -> None:
    scores, labels = (np.array(column) for column in zip(*rows, strict=True))
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    expected = (rankdata(scores)[labels == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    assert leak_auc(scores, labels).raw == pytest.approx(expected, abs=1e-12)


def test_leak_auc_refuses_nan_scores() -> None:
    with pytest.raises(ValueError, match="NaN"):
        leak_auc(np.array([0.1, np.nan, 0.3]), np.array([0, 1, 1]))


def test_leak_auc_all_ties_is_half() -> None:
    assert leak_auc(np.zeros(6), np.array([0, 1, 0, 1, 1, 0])).raw == 0.5


def test_summarise_known_values() -> None:
    summary = summarise([0.5, 0.6, 0.7, 0.8, 0.9])
    assert summary["mean"] == pytest.approx(0.7)
    assert summary["p95"] == pytest.approx(0.88)
    assert summary["max"] == 0.9 and summary["n"] == 5
    empty = summarise([])
    assert empty["n"] == 0 and math.isnan(empty["mean"])


def test_sumkl_bounds_known_values() -> None:
    assert auc_bound_from_sumkl(0.0) == 0.5
    assert auc_bound_from_sumkl(1.0) == pytest.approx(0.875)
    assert auc_bound_from_sumkl(3.999999) == pytest.approx(1.0)
    assert auc_bound_from_sumkl(4.0) == 1.0 and auc_bound_from_sumkl(9.0) == 1.0
    assert detection_error_lower_bound(0.0) == 0.5
    assert detection_error_lower_bound(1.0) == 0.25
    assert detection_error_lower_bound(16.0) == 0.0
    with pytest.raises(ValueError):
        auc_bound_from_sumkl(-0.1)


def test_attack_rng_is_deterministic_and_keyed() -> None:
    draw = lambda *key: attack_rng(*key).integers(0, 2**62, 4).tolist()  # noqa: E731
    assert draw(1, 5, 0, "norm") == draw(1, 5, 0, "norm")
    others = [(2, 5, 0, "norm"), (1, 6, 0, "norm"), (1, 5, 1, "norm"), (1, 5, 0, "hint_inner(k=1)")]
    assert all(draw(*key) != draw(1, 5, 0, "norm") for key in others)
    assert draw(1, 5, "passive-0", "norm") == draw(1, 5, "passive-0", "norm")


def test_evaluate_batch_is_reproducible_with_attack_rng() -> None:
    gradients, labels = separable_batch(seed=4)
    gradients = gradients + np.random.default_rng(9).standard_normal(gradients.shape).astype(
        np.float32
    )
    attack = build_attack("hint_distance", {"k": 3})
    runs = [
        evaluate_batch(attack, gradients, labels, attack_rng(0, 3, 0, attack.label)) for _ in "ab"
    ]
    assert runs[0] == runs[1]


# --- conformance: every registered attack --------------------------------------------------


def test_defaults_cover_every_registered_attack() -> None:
    defaults = {name for name, _ in DEFAULT_ATTACKS + DEFAULT_MULTICLASS_ATTACKS} | set(RUN_ATTACKS)
    assert defaults == set(ATTACKS.names())
    for name, params in DEFAULT_ATTACKS:
        assert build_attack(name, params).metric_kind(2) == "score"
    for name, params in DEFAULT_MULTICLASS_ATTACKS:
        assert build_attack(name, params).metric_kind(10) in ("label", "counts")
    for name in RUN_ATTACKS:
        assert isinstance(build_attack(name, {}), RunAttack)


def test_a_new_attack_gets_its_clean_anchors_without_a_change_in_the_core(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The label party writes clean anchors where the resolved config says so; which attacks
    # need them is each attack's own declaration, read through its registry at validation.
    from attacker.attacks.cosine_oracle import CosineOracleAttack
    from splitleak.config import parse_config
    from splitleak.validation import validate
    from tests.conftest import small_config

    class Anchored(CosineOracleAttack):
        name = "anchored_test_attack"

    monkeypatch.setitem(ATTACKS._entries, Anchored.name, Anchored)
    cfg = parse_config(small_config(tmp_path, attacker={"attacks": ["norm", Anchored.name]}))
    assert validate(cfg).cfg.evaluation.clean_anchors == [1]
    monkeypatch.setattr(Anchored, "needs_clean_anchors", False)
    assert validate(cfg).cfg.evaluation.clean_anchors == []
    declared = {name for name in ATTACKS.names() if ATTACKS.get(name).needs_clean_anchors}
    assert declared & {name for name, _ in DEFAULT_ATTACKS}  # the defaults need them


def _run(attack: Attack, gradients: np.ndarray, labels: np.ndarray, seed: int,
         num_classes: int | None = None) -> AttackResult:
    return attack(gradients, SideKnowledge(labels, np.random.default_rng(seed), num_classes))


def _check_result(attack: Attack, result: AttackResult, n_rows: int, dim: int,
                  num_classes: int = 2) -> None:
    assert result.exclude.shape == (n_rows,) and result.exclude.dtype == np.bool_
    if result.skip_reason is not None:  # outside what the attack works on, and it says why
        assert result.skip_reason.strip() and not result.exclude.any()
        return
    kind = attack.metric_kind(num_classes)
    if kind == "counts":
        assert result.values.shape == (num_classes,)
        assert (result.values >= 0).all() and result.values.sum() == n_rows
        np.testing.assert_array_equal(result.values, np.round(result.values))
        return
    assert result.values.shape == (n_rows,)
    if kind == "score":
        assert np.isfinite(result.values[~result.exclude]).all()
    else:
        assert np.issubdtype(result.values.dtype, np.integer)
        assert ((result.values >= -1) & (result.values < max(dim, num_classes))).all()


METRIC_VALUE = {"score": "auc", "label": "accuracy", "counts": "count_error"}
BATCH_ATTACKS = [name for name in ATTACKS.names() if issubclass(ATTACKS.get(name), Attack)]


@pytest.mark.parametrize("num_classes", [2, 4])
@pytest.mark.parametrize("name", BATCH_ATTACKS)
def test_attack_conformance(name: str, num_classes: int) -> None:
    cls = ATTACKS.get(name)
    attack = build_attack(name, {})
    kind = attack.metric_kind(num_classes)
    assert cls.name == name and kind in METRIC_VALUE
    assert attack.side_knowledge.strip() and "\n" not in attack.side_knowledge
    assert attack.label.startswith(name)
    if kind == "score" and num_classes > 2:
        return  # scores rank two classes; the analysis never runs them on more

    rng = np.random.default_rng(11)
    dim = 10 if num_classes == 2 else num_classes  # K columns: logit gradients, for counts
    gradients = rng.standard_normal((64, dim)).astype(np.float32)
    labels = (rng.random(64) * num_classes ** 0.5).astype(np.int64) ** 2 % num_classes
    first = _run(attack, gradients, labels, seed=2, num_classes=num_classes)
    second = _run(attack, gradients, labels, seed=2, num_classes=num_classes)
    _check_result(attack, first, 64, dim, num_classes)
    np.testing.assert_array_equal(first.values, second.values)
    np.testing.assert_array_equal(first.exclude, second.exclude)
    leak = evaluate_batch(attack, gradients, labels, np.random.default_rng(2), num_classes=num_classes)
    assert leak.skipped or getattr(leak, METRIC_VALUE[kind]) is not None

    zero_rows = gradients.copy()
    zero_rows[::3] = 0.0
    edge_cases = [
        (gradients[:1], labels[:1]),  # B = 1
        (gradients[:, :1], labels),  # d = 1
        (zero_rows, labels),  # some zero rows
        (np.zeros_like(gradients), labels),  # all zero
        (gradients[:5], np.ones(5, dtype=np.int64)),  # one class
        (gradients[:5], np.zeros(5, dtype=np.int64)),
    ]
    for batch, batch_labels in edge_cases:
        result = _run(attack, batch, batch_labels, seed=0, num_classes=num_classes)
        _check_result(attack, result, *batch.shape, num_classes)
        evaluate_batch(attack, batch, batch_labels, np.random.default_rng(0), num_classes=num_classes)


def test_center_attack_label_hides_unused_hints() -> None:
    assert build_attack("mean", {"centers": "oracle"}).label == "mean(centers=oracle)"
    assert build_attack("median", {"centers": "hint", "hints": 3}).label == (
        "median(centers=hint, hints=3)"
    )


@pytest.mark.parametrize("name", ATTACKS.names())
def test_every_attack_declares_its_vflair_family(name: str) -> None:
    """compare groups attacks by VFLAIR's families (T-DCS); every plug-in says which it is in,
    and how its attack performance (AP) reads from its summary entry."""
    cls = ATTACKS.get(name)
    assert cls.family in FAMILIES
    assert cls.vflair is None or (cls.vflair.isupper() and cls.vflair.isalpha())
    ap = cls.attack_performance({})
    assert set(ap) == {"metric", "value"} and ap["metric"].strip() and ap["value"] is None


def test_attack_performance_reads_each_metric() -> None:
    base = ATTACKS.get("norm")
    assert base.attack_performance({"flipped": {"mean": 0.8}})["value"] == 0.8
    assert base.attack_performance({"count_error": {"mean": 0.25}})["value"] == 0.75
    assert base.attack_performance({"pooled": {"accuracy": 0.4}})["value"] == 0.4
    recon = ATTACKS.get("back_mapping")
    assert recon.attack_performance({"reconstruction": {"mse_range": 0.1}})["value"] == 0.9
    assert recon.attack_performance({"reconstruction": {"mse_range": 1.5}})["value"] == 0.0


@pytest.mark.parametrize("name", ["cosine_majority", "cosine_oracle", "clustering"])
def test_direction_attacks_on_one_sign_scalar_gradients_say_why_they_skip(name: str) -> None:
    """GAFM with model.top = "none": the cut gradient is one column, and early in training every
    row of a batch can have the same sign; the skip names that, not a bare tie."""
    from attacker.attacks._batch import ONE_SIGN

    labels = np.array([0, 1, 0, 1, 0, 0])
    gradients = np.array([[0.1], [0.4], [0.2], [0.9], [0.3], [0.05]])
    leak = evaluate_batch(build_attack(name, {}), gradients, labels, np.random.default_rng(0))
    assert leak.skip_reason == ONE_SIGN and leak.skipped
    mixed = evaluate_batch(build_attack(name, {}), gradients * np.array([[1], [-1], [1], [-1], [1], [1]]),
                           labels, np.random.default_rng(0))
    assert not mixed.skipped and mixed.auc is not None and mixed.auc.flipped == 1.0


def test_cosine_majority_on_evenly_signed_scalar_gradients_names_the_even_split() -> None:
    from attacker.attacks._batch import EVEN_SIGNS

    gradients = np.array([[0.1], [-0.4], [0.2], [-0.9]])
    leak = evaluate_batch(build_attack("cosine_majority", {}), gradients, np.array([0, 1, 0, 1]),
                          np.random.default_rng(0))
    assert leak.skip_reason == EVEN_SIGNS
