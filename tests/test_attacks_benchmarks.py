"""The other benchmarks' attacks: k-means clustering and batch label counts, and the analysis
paths they add (per-epoch pooling, the count-error metric)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import softmax

from attacker.analysis.analyze import analyze
from attacker.analysis.leak import count_error, evaluate_batch
from attacker.attacks import SideKnowledge, build_attack
from attacker.attacks.batch_label_counts import whole_counts
from attacker.sidecar.store import GradientStore
from splitleak.artifacts.paths import RunDir

HYPOTHESIS = settings(deadline=None, max_examples=60, derandomize=True)


def blobs(classes: int, per_class: int, dim: int = 6, spread: float = 0.05,
          seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One tight blob per class around well-separated directions (shuffled)."""
    rng = np.random.default_rng(seed)
    centres = np.eye(dim)[:classes] * 3.0 - np.eye(dim)[classes % dim]
    labels = np.repeat(np.arange(classes), per_class)
    rows = centres[labels] + spread * rng.standard_normal((labels.size, dim))
    order = rng.permutation(labels.size)
    return rows[order].astype(np.float32), labels[order]


def evaluate(name: str, params: dict, gradients: np.ndarray, labels: np.ndarray,
             num_classes: int | None = None, seed: int = 0):
    return evaluate_batch(build_attack(name, params), gradients, labels,
                          np.random.default_rng(seed), num_classes=num_classes)


# --- clustering ------------------------------------------------------------------------------


def test_clustering_binary_scores_the_minority_cluster_higher() -> None:
    gradients, labels = blobs(2, 30)
    keep = (labels == 0) | (np.arange(labels.size) % 3 == 0)  # positives (1) become the minority
    gradients, labels = gradients[keep], labels[keep]
    result = build_attack("clustering", {})(gradients, SideKnowledge(labels, np.random.default_rng(0)))
    assert result.values[labels == 1].min() > result.values[labels == 0].max()
    leak = evaluate("clustering", {}, gradients, labels)
    assert leak.metric == "auc" and leak.auc.raw == 1.0


def test_clustering_binary_with_positives_the_majority_is_flipped() -> None:
    gradients, labels = blobs(2, 30)
    keep = (labels == 1) | (np.arange(labels.size) % 3 == 0)  # now negatives are the minority
    leak = evaluate("clustering", {}, gradients[keep], labels[keep])
    assert leak.auc.raw == 0.0 and leak.auc.flipped == 1.0


@pytest.mark.parametrize("classes", [3, 5])
def test_clustering_multiclass_is_best_permutation_accuracy(classes: int) -> None:
    gradients, labels = blobs(classes, 20, seed=classes)
    relabel = np.roll(np.arange(classes), 1)  # the clusters' order means nothing
    for truth in (labels, relabel[labels]):
        leak = evaluate("clustering", {}, gradients, truth, num_classes=classes)
        assert leak.metric == "accuracy" and leak.accuracy == 1.0


def test_clustering_multiclass_on_noise_is_near_chance() -> None:
    rng = np.random.default_rng(3)
    gradients = rng.standard_normal((3000, 8)).astype(np.float32)
    labels = rng.integers(0, 4, 3000)
    leak = evaluate("clustering", {}, gradients, labels, num_classes=4)
    # The best of 4! matchings of 4 clusters to independent labels: a little above 1/4.
    assert 0.25 <= leak.accuracy < 0.30


def test_clustering_needs_as_many_distinct_rows_as_classes() -> None:
    gradients = np.tile(np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32), (5, 1))
    labels = np.arange(10) % 3
    leak = evaluate("clustering", {}, gradients, labels, num_classes=3)
    assert leak.skipped and "fewer distinct gradient rows (2) than the 3 clusters" in leak.skip_reason


def test_clustering_normalize_clusters_by_direction() -> None:
    # Two directions, with norms that vary far more within a class than between the classes.
    rng = np.random.default_rng(1)
    labels = np.repeat([0, 1], 50)
    norms = rng.uniform(0.1, 10.0, 100)
    directions = np.where(labels[:, None] == 1, [[1.0, 0.8]], [[0.8, 1.0]])
    gradients = (norms[:, None] * directions).astype(np.float32)
    assert evaluate("clustering", {}, gradients, labels).auc.flipped == 1.0
    assert evaluate("clustering", {"normalize": False}, gradients, labels).auc.flipped < 0.75


def test_clustering_is_deterministic_by_rng_and_labels_its_scope() -> None:
    gradients = np.random.default_rng(2).standard_normal((200, 5)).astype(np.float32)
    labels = np.random.default_rng(3).integers(0, 2, 200)
    runs = [evaluate("clustering", {}, gradients, labels, seed=7) for _ in "ab"]
    assert runs[0] == runs[1]
    assert build_attack("clustering", {}).label == "clustering"
    epoch = build_attack("clustering", {"scope": "epoch"})
    assert epoch.label == "clustering(scope=epoch)" and epoch.per_epoch
    assert not build_attack("clustering", {}).per_epoch


# --- batch label counts ----------------------------------------------------------------------


def mean_ce_gradients(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """What a party receives with no top model: d(mean CE)/d logits = (p − onehot)/B."""
    return ((probs - np.eye(probs.shape[1])[labels]) / labels.size).astype(np.float32)


def test_counts_are_exact_at_uniform_predictions() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, 64)
    gradients = mean_ce_gradients(np.full((64, 5), 0.2), labels)
    result = build_attack("batch_label_counts", {})(gradients, SideKnowledge(labels, rng, 5))
    np.testing.assert_array_equal(result.values, np.bincount(labels, minlength=5))
    leak = evaluate("batch_label_counts", {}, gradients, labels, num_classes=5)
    assert leak.metric == "count_error" and leak.count_error == 0.0


def test_counts_error_is_the_predictions_departure_from_uniform() -> None:
    # Σ_j p_j departs from B/K by Δ; the inferred counts are off by exactly Δ (before rounding).
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, 400)
    probs = softmax(rng.normal(size=(400, 4)), axis=1)
    gradients = mean_ce_gradients(probs, labels)
    result = build_attack("batch_label_counts", {})(gradients, SideKnowledge(labels, rng, 4))
    truth = np.bincount(labels, minlength=4)
    departure = probs.sum(0) - 100.0
    assert np.abs(result.values - (truth - departure)).max() <= 1.0
    expected = np.abs(result.values - truth).sum() / 800
    assert count_error(result.values, labels, 4) == pytest.approx(expected)


def test_counts_binary_bce_one_logit() -> None:
    labels = np.array([1, 0, 0, 1, 0, 0, 0, 0])
    gradients = ((0.5 - labels) / labels.size).astype(np.float32)[:, None]
    leak = evaluate("batch_label_counts", {}, gradients, labels)
    assert leak.count_error == 0.0
    summed = (0.5 - labels).astype(np.float32)[:, None]  # a label party summing its loss
    assert evaluate("batch_label_counts", {"reduction": "sum"}, summed, labels).count_error == 0.0
    assert build_attack("batch_label_counts", {"reduction": "sum"}).label == (
        "batch_label_counts(reduction=sum)")


def test_counts_need_logit_gradients() -> None:
    labels = np.arange(12) % 3
    leak = evaluate("batch_label_counts", {}, np.ones((12, 8), dtype=np.float32), labels,
                    num_classes=3)
    assert leak.skipped and "gradient width 8 is not the 3 logits" in leak.skip_reason


def test_count_error_known_values() -> None:
    labels = np.array([0, 0, 1, 2])
    assert count_error(np.array([2, 1, 1]), labels, 3) == 0.0
    assert count_error(np.array([0, 0, 4]), labels, 3) == pytest.approx(3 / 4)  # 3 rows misplaced
    assert count_error(np.array([4, 0, 0, 0]), np.array([1, 1, 2, 3]), 4) == 1.0  # disjoint
    with pytest.raises(ValueError, match="one entry per class"):
        count_error(np.array([1, 1]), labels, 3)


@HYPOTHESIS
@given(estimate=st.lists(st.floats(-50, 200, allow_nan=False), min_size=1, max_size=12),
       total=st.integers(0, 500))
def test_whole_counts(estimate: list[float], total: int) -> None:
    counts = whole_counts(np.array(estimate), total)
    assert counts.dtype == np.int64 and counts.sum() == total and (counts >= 0).all()
    weights = np.maximum(estimate, 0.0)
    if weights.sum() > 0:
        exact = weights * total / weights.sum()
        assert np.abs(counts - exact).max() < 1.0  # largest remainders: never a whole row off


# --- analysis: per-epoch pooling and the count metric ----------------------------------------


def synthetic_run(root: Path, classes: int, width: int, batches: list[tuple[int, int]],
                  rows: int = 30, activation: bool = False) -> RunDir:
    """A run directory with a gradient log of logit gradients at uniform predictions (cut layer)
    and noise at the first layer, for the given (epoch, step) batches of `rows` rows each; its
    config says so: no top model, the gradient is the loss's in the logits."""
    run = RunDir(root)
    run.label_party.mkdir(parents=True)
    run.config.write_text('[run]\nseed = 5\n\n[model]\ntop = "none"\n')
    rng = np.random.default_rng(0)
    labels = rng.integers(0, classes, rows * len(batches))
    pq.write_table(pa.table({"sample_id": np.arange(labels.size), "label": labels,
                             "split": ["train"] * labels.size}), run.labels)
    store = GradientStore(run.attacker / "gradients", "synthetic")
    for i, (epoch, step) in enumerate(batches):
        ids = np.arange(i * rows, (i + 1) * rows)
        probs = np.full((rows, width), 1.0 / width)
        cut = mean_ce_gradients(probs, labels[ids]) if width == classes else rng.standard_normal(
            (rows, width)).astype(np.float32)
        tensors = {"cut_gradient": cut,
                   "first_layer_gradient": rng.standard_normal((rows, 4)).astype(np.float32)}
        if activation:  # what the party sent: one tight blob per class
            tensors["activation"] = blobs(classes, 1, seed=i)[0][labels[ids]] + 0.01 * \
                rng.standard_normal((rows, 6)).astype(np.float32)
        store.append(1, epoch, step, ids, tensors)
    store.close()
    return run


def test_analysis_pools_epoch_scope_attacks_and_counts_at_the_cut_layer(tmp_path: Path) -> None:
    batches = [(0, 0), (0, 1), (0, 2), (1, 3), (1, 4)]
    run = synthetic_run(tmp_path / "run", classes=3, width=3, batches=batches)
    summary = analyze(run.root, [("clustering", {"scope": "epoch"}), ("clustering", {}),
                                 ("batch_label_counts", {})])
    leak = pq.read_table(run.attacker / "leak.parquet").to_pylist()
    epoch_rows = [r for r in leak if r["attack"] == "clustering(scope=epoch)"]
    assert [(r["layer"], r["epoch"], r["step"], r["n_rows"]) for r in epoch_rows] == [
        ("cut", 0, 2, 90), ("first", 0, 2, 90), ("cut", 1, 4, 60), ("first", 1, 4, 60)]
    assert all(r["metric"] == "accuracy" for r in epoch_rows)
    per_batch = [r for r in leak if r["attack"] == "clustering"]
    assert len(per_batch) == 2 * len(batches) and {r["n_rows"] for r in per_batch} == {30}
    counts = [r for r in leak if r["attack"] == "batch_label_counts"]
    assert [r["layer"] for r in counts] == ["cut"] * len(batches)  # logit gradients only
    assert all(r["count_error"] == 0.0 and r["metric"] == "count_error" for r in counts)
    entry = next(e for e in summary["leak"] if e["attack"] == "batch_label_counts"
                 and e["scope"] == "run")
    assert entry["count_error"]["max"] == 0.0 and entry["batches"] == len(batches)
    again = analyze(run.root, [("clustering", {"scope": "epoch"})])
    first = [e for e in summary["leak"] if e["attack"] == "clustering(scope=epoch)"]
    assert [e for e in again["leak"]] == first  # deterministic by the run seed


def test_analysis_skips_counts_off_the_logits(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run", classes=2, width=8, batches=[(0, 0), (0, 1)])
    analyze(run.root, [("batch_label_counts", {})])
    leak = pq.read_table(run.attacker / "leak.parquet").to_pylist()
    assert len(leak) == 2 and all("not the 2 logits" in r["skip_reason"] for r in leak)


def test_analysis_clusters_the_recorded_activations(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run", classes=3, width=3, batches=[(0, 0), (0, 1)],
                        activation=True)
    summary = analyze(run.root, [("clustering", {}), ("batch_label_counts", {})])
    layers = {(e["attack"], e["layer"]) for e in summary["leak"] if e["scope"] == "run"}
    assert layers == {("clustering", "cut"), ("clustering", "first"), ("clustering", "activation"),
                      ("batch_label_counts", "cut")}  # only clustering reads activations
    entry = next(e for e in summary["leak"] if e["layer"] == "activation" and e["scope"] == "run")
    assert entry["accuracy"]["mean"] == 1.0  # the blobs are the classes
