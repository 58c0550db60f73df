"""Leak metrics: per-batch leak AUC and label accuracy, run summaries and the sumKL bounds."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict, Unpack

import numpy as np

from attacker.analysis.answers import attack_answer
from attacker.attacks.base import NO_PREDICTION, Attack, SideKnowledge

# Keeps these streams apart from any other SeedSequence the project derives from the same seed.
_RNG_DOMAIN = zlib.crc32(b"splitleak.attacker.attack_rng")


@dataclass(frozen=True)
class LeakAUC:
    """ROC AUC of attack scores against the labels; `flipped` is GAFM's max(AUC, 1 - AUC)."""

    raw: float
    flipped: float
    n_rows: int
    n_pos: int


SkipKind = Literal["empty", "single_class", "degenerate", "side_knowledge", "no_prediction",
                   "attack", "premise"]
Metric = Literal["auc", "accuracy", "count_error"]
METRIC_OF_KIND: dict[str, Metric] = {"score": "auc", "label": "accuracy", "counts": "count_error"}


class _LabelCounts(TypedDict, total=False):
    """A label attack's row counts (BatchLeak's fields of the same names)."""
    n_correct: int
    n_predicted: int
    n_no_prediction: int


@dataclass(frozen=True)
class BatchLeak:
    """One attack's metric on one batch, or why the batch was skipped (never scored 0.5)."""

    attack: str  # the attack's label, e.g. `hint_distance(k=3)`
    metric: Metric
    n_rows: int  # rows in the batch
    n_excluded: int  # rows left out as side knowledge
    auc: LeakAUC | None = None
    accuracy: float | None = None
    skip_reason: str | None = None
    skip_kind: SkipKind | None = None
    n_correct: int | None = None  # label attacks: rows predicted right,
    n_predicted: int | None = None  # rows with a prediction (the accuracy's denominator),
    n_no_prediction: int | None = None  # rows the rule made no prediction on (skipped, counted)
    count_error: float | None = None  # Σ_c |n̂_c − n_c| / (2B) (counts attacks)
    # score attacks: accuracy of the attack's threshold rule (VFLAIR's attack performance)
    threshold_accuracy: float | None = None

    @property
    def skipped(self) -> bool:
        return self.skip_reason is not None


def _kept(n_rows: int, exclude: np.ndarray | None) -> np.ndarray:
    if exclude is None:
        return np.ones(n_rows, dtype=bool)
    exclude = np.asarray(exclude, dtype=bool)
    if exclude.shape != (n_rows,):
        raise ValueError(f"exclude must have shape ({n_rows},), got {exclude.shape}")
    return ~exclude


def _binary(labels: np.ndarray) -> bool:
    """Every label is 0 or 1 (what np.isin(labels, (0, 1)).all() says, a tenth of its cost on a
    batch; the analysis asks it ~50 times a batch)."""
    return bool(((labels == 0) | (labels == 1)).all())


def _positive_rank_sum(scores: np.ndarray, positive: np.ndarray) -> float:
    """Sum of the positives' 1-based ranks, tied scores sharing their average rank.

    The Mann-Whitney form of the AUC: exact, with a tie between classes counting 1/2. Same
    result as scipy.stats.rankdata(scores)[positive].sum(), several times faster on a batch.
    """
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    starts_group = np.empty(ordered.size, dtype=bool)
    starts_group[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts_group[1:])
    starts = np.flatnonzero(starts_group)
    ends = np.append(starts[1:], ordered.size)
    average_rank = (starts + ends + 1) / 2.0  # mean of the ranks starts+1 .. ends
    group = np.cumsum(starts_group) - 1
    return float(average_rank[group][positive[order]].sum())


def leak_auc(
    scores: np.ndarray, labels: np.ndarray, exclude: np.ndarray | None = None
) -> LeakAUC | None:
    """Exact ROC AUC (ties count one half) over the non-excluded rows; None for a single class."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels)
    if scores.ndim != 1 or labels.shape != scores.shape:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape} must be equal 1-D")
    if not _binary(labels):
        raise ValueError("leak AUC needs binary labels in {0, 1}")
    keep = _kept(scores.shape[0], exclude)
    scores, positive = scores[keep], labels[keep] == 1
    n_pos = int(np.count_nonzero(positive))
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    if np.isnan(scores).any():
        raise ValueError("attack scores contain NaN")
    rank_sum = _positive_rank_sum(scores, positive)
    raw = (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return LeakAUC(raw=raw, flipped=max(raw, 1.0 - raw), n_rows=positive.size, n_pos=n_pos)


def label_accuracy(
    pred: np.ndarray, labels: np.ndarray, exclude: np.ndarray | None = None
) -> float | None:
    """Top-1 accuracy of inferred labels over the non-excluded rows that got a prediction
    (NO_PREDICTION rows are left out, as Fu et al. count); None if no such row is left."""
    pred, labels = np.asarray(pred), np.asarray(labels)
    if pred.ndim != 1 or labels.shape != pred.shape:
        raise ValueError(f"pred {pred.shape} and labels {labels.shape} must be equal 1-D")
    keep = _kept(pred.shape[0], exclude) & (pred != NO_PREDICTION)
    if not keep.any():
        return None
    return float(np.mean(pred[keep] == labels[keep]))


def count_error(counts: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Σ_c |n̂_c − n_c| / (2B): the share of the batch the inferred class counts misplace."""
    truth = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)
    counts = np.asarray(counts, dtype=np.float64)
    if counts.shape != truth.shape:
        raise ValueError(f"counts {counts.shape} must have one entry per class {truth.shape}")
    return float(np.abs(counts - truth).sum() / (2 * truth.sum()))


def pooled_accuracy(correct: Sequence[int] | np.ndarray,
                    predicted: Sequence[int] | np.ndarray) -> float | None:
    """Accuracy over every row of every batch (a 4-row batch weighs 4 rows, not one batch)."""
    total = int(np.sum(predicted, dtype=np.int64))
    return int(np.sum(correct, dtype=np.int64)) / total if total else None


def summarise(values: Sequence[float]) -> dict[str, float | int]:
    """Mean, 95th percentile (linear interpolation; Li et al.'s headline) and max over batches."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return {"mean": math.nan, "p95": math.nan, "max": math.nan, "n": 0}
    return {
        "mean": float(array.mean()),
        "p95": float(np.percentile(array, 95)),
        "max": float(array.max()),
        "n": int(array.size),
    }


def auc_bound_from_sumkl(eps: float) -> float:
    """Li et al. Thm 1: sumKL <= eps (0 <= eps < 4) caps every attack's AUC; 1.0 beyond."""
    if eps < 0:
        raise ValueError(f"sumKL must be >= 0, got {eps}")
    if eps >= 4:
        return 1.0
    return 0.5 + math.sqrt(eps) / 2 - eps / 8


def detection_error_lower_bound(sumkl: float) -> float:
    """The reference code's detection-error floor 0.5 - sqrt(sumKL)/4, never below 0."""
    if sumkl < 0:
        raise ValueError(f"sumKL must be >= 0, got {sumkl}")
    return max(0.0, 0.5 - math.sqrt(sumkl) / 4)


def attack_rng(seed: int, step: int, party_id: int | str, attack_label: str) -> np.random.Generator:
    """The generator for one (batch, party, attack): reproducible and independent of run order."""
    if seed < 0 or step < 0:
        raise ValueError(f"seed and step must be >= 0, got {seed}, {step}")
    party = party_id if isinstance(party_id, int) else zlib.crc32(party_id.encode())
    if party < 0:
        raise ValueError(f"party_id must be >= 0, got {party_id}")
    entropy = [_RNG_DOMAIN, seed, step, party, zlib.crc32(attack_label.encode())]
    return np.random.default_rng(np.random.SeedSequence(entropy))


def _skip_after_exclusion(labels: np.ndarray, keep: np.ndarray, n_used: int) -> str:
    n_excluded = int(np.count_nonzero(~keep))
    if not keep.any():
        if n_used < keep.size:  # the attack gave up: its side knowledge lacked what it needs
            return f"side knowledge unusable ({n_used} row(s) revealed); no row scored"
        return f"no row left after excluding {n_excluded} side-knowledge row(s)"
    missing = "positive" if not np.any(labels[keep] == 1) else "negative"
    return f"no {missing} left after excluding {n_excluded} side-knowledge row(s)"


def _all_tied(scores: np.ndarray) -> bool:
    return scores.size > 0 and bool(np.all(scores == scores[0]))


def premise_failed(attack: Attack, n_rows: int, num_classes: int, reason: str) -> BatchLeak:
    """A batch the attack does not apply to, because its premise fails for the run."""
    return BatchLeak(attack.label, METRIC_OF_KIND[attack.metric_kind(num_classes)], n_rows, 0,
                     skip_reason=f"premise: {reason}", skip_kind="premise")


def evaluate_batch(
    attack: Attack, gradients: np.ndarray, labels: np.ndarray, rng: np.random.Generator,
    clean_anchor: tuple[int, np.ndarray] | None = None,
    num_classes: int | None = None,
) -> BatchLeak:
    """Run one attack on one batch: AUC for score attacks (binary labels), accuracy for label
    attacks, count error for count attacks. Rows handed out as side knowledge never count, even
    if the attack forgets them. A batch that carries no information (empty input, all kept
    scores tied, no prediction on any row) is skipped and counted, never scored 0.5.
    `clean_anchor` = (row, clean gradient) of the positive the label party drew for this batch,
    if the run wrote one. `num_classes`: the task's (default: from the batch's labels)."""
    gradients = np.asarray(gradients, dtype=np.float32)
    gradients = gradients.reshape(gradients.shape[0], -1)  # flatten multi-dimensional cut layers
    labels = np.asarray(labels)
    n_rows = gradients.shape[0]
    if labels.shape != (n_rows,):
        raise ValueError(f"labels must have shape ({n_rows},), got {labels.shape}")
    num_classes = num_classes or max(2, int(labels.max()) + 1 if n_rows else 2)
    metric = METRIC_OF_KIND[attack.metric_kind(num_classes)]

    def skipped(kind: SkipKind, reason: str, n_excluded: int = 0,
                **counts: Unpack[_LabelCounts]) -> BatchLeak:
        return BatchLeak(attack.label, metric, n_rows, n_excluded, skip_reason=reason,
                         skip_kind=kind, **counts)

    if n_rows == 0 or gradients.shape[1] == 0:
        return skipped("empty", "empty batch" if n_rows == 0 else "empty attack input (d = 0)")
    if metric == "auc":
        if not _binary(labels):
            raise ValueError(f"{attack.label} is a score attack and needs binary labels")
        if labels.min() == labels.max():
            return skipped("single_class", f"single class in batch (all {int(labels[0])})")

    side = SideKnowledge(labels, rng, num_classes, clean_anchor)
    result = attack_answer(attack, gradients, side, metric, num_classes, labels)
    if result.skip_reason is not None:
        return skipped("attack", result.skip_reason)
    if metric == "count_error":
        error = count_error(result.values, labels, num_classes)
        return BatchLeak(attack.label, metric, n_rows, 0, count_error=error)
    keep = ~(result.exclude | side.used)
    n_used = int(np.count_nonzero(side.used))
    n_excluded = n_rows - int(np.count_nonzero(keep))

    if metric == "auc":
        auc = leak_auc(result.values, labels, ~keep)
        if auc is None:
            return skipped("side_knowledge", _skip_after_exclusion(labels, keep, n_used), n_excluded)
        scores = np.asarray(result.values)[keep]
        if _all_tied(scores):
            return skipped("degenerate", f"degenerate: all {auc.n_rows} scores tied (no information)",
                           n_excluded)
        decisions = result.decisions[keep] if result.decisions is not None else None
        accuracy = attack.threshold.accuracy(scores, labels[keep], decisions)
        return BatchLeak(attack.label, metric, n_rows, n_excluded, auc=auc, threshold_accuracy=accuracy)
    if not keep.any():
        return skipped("side_knowledge", _skip_after_exclusion(labels, keep, n_used), n_excluded)
    predicted = keep & (result.values != NO_PREDICTION)
    n_predicted = int(np.count_nonzero(predicted))
    n_correct = int(np.count_nonzero(result.values[predicted] == labels[predicted]))
    counts: _LabelCounts = {"n_correct": n_correct, "n_predicted": n_predicted,
                            "n_no_prediction": int(np.count_nonzero(keep)) - n_predicted}
    if n_predicted == 0:
        return skipped("no_prediction", "no prediction on any row", n_excluded, **counts)
    return BatchLeak(attack.label, metric, n_rows, n_excluded, accuracy=n_correct / n_predicted,
                     **counts)
