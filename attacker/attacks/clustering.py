"""Clustering attack (SecretFlow's similarity-based label inference; Liu & Lyu): k-means on gradients.

k-means with k = the number of classes on the received gradients of one batch (or, with
scope = "epoch", of one epoch), rows scaled to unit length first (SecretFlow's similarity
attack normalises them; `normalize = false` clusters the raw rows). No label is used to cluster.
When the run records the activations the party sent (`attacker.record_activation`), the
analysis also clusters those (layer "activation"): the forward embeddings PELoss and dCor act on.

- Binary: score = −‖g − c_min‖, c_min the centre of the smaller cluster, so larger means more
  likely positive under the declared side knowledge that positives are the minority (equal
  sizes: cluster 0). AUC as for every score attack; the flip-corrected value covers a batch
  where positives are the majority. The threshold accuracy labels the smaller cluster positive.
- Multi-class: clusters are matched to classes by the assignment that maximises agreement with
  the true labels (scipy's linear_sum_assignment, the Hungarian method), and each row is
  labelled with its cluster's class: best-permutation accuracy, an upper bound on what an
  attacker without labels gets from the clusters, flagged as such in the side knowledge.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

import numpy as np
from pydantic import Field
from threadpoolctl import ThreadpoolController

from attacker.attacks._batch import (
    as_rows,
    distances,
    no_rows_excluded,
    not_applicable,
    one_sign,
    unit_rows,
)
from attacker.attacks.base import (
    ATTACKS,
    Attack,
    AttackKind,
    AttackParams,
    AttackResult,
    SideKnowledge,
    label_without_defaults,
)
from attacker.attacks.thresholds import ThresholdRule
from splitleak.settings import MAX_RESTARTS


def _unused(scores: np.ndarray) -> np.ndarray:
    raise AssertionError("the binary clustering attack returns its own decisions")


SMALLER_CLUSTER = ThresholdRule("positive where in the smaller k-means cluster, then "
                                "max(acc, 1 − acc)", _unused, flip=True)


class ClusteringParams(AttackParams):
    scope: Literal["batch", "epoch"] = "batch"  # cluster each batch, or each epoch's rows at once
    normalize: bool = True  # unit-length rows (cosine-like clusters), as SecretFlow
    # k-means restarts (k-means++ starts), the best inertia kept
    n_init: int = Field(1, ge=1, le=MAX_RESTARTS)


@cache
def _thread_pools() -> ThreadpoolController:
    """The loaded thread pools, found once: a scan of the process's libraries costs ≈ 6 ms,
    as much as the k-means fit of a 1024-row batch."""
    return ThreadpoolController()


@ATTACKS.register("clustering")
class ClusteringAttack(Attack):
    name = "clustering"
    family = "label_inference"
    side_knowledge = (
        "binary: positives are the minority (the smaller k-means cluster is taken as positive); "
        "multi-class: the number of classes, and clusters matched to classes by the best "
        "permutation against the true labels (Hungarian), an upper bound"
    )
    Params = ClusteringParams
    params: ClusteringParams
    threshold = SMALLER_CLUSTER
    on_activations = True  # SecretFlow's attack clusters gradients or forward embeddings

    @property
    def label(self) -> str:
        return label_without_defaults(self)

    def metric_kind(self, num_classes: int) -> AttackKind:
        return "score" if num_classes == 2 else "label"

    @property
    def per_epoch(self) -> bool:
        return self.params.scope == "epoch"

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        rows = as_rows(gradients)
        if self.params.normalize:
            reason = one_sign(rows)
            if reason is not None:
                return not_applicable(rows.shape[0], reason)
            rows = unit_rows(rows)
        n_rows, k = rows.shape[0], side.num_classes
        distinct = np.unique(rows, axis=0).shape[0]
        if distinct < k:
            return not_applicable(n_rows, f"fewer distinct gradient rows ({distinct}) than the "
                                          f"{k} clusters")
        # One thread: on a batch, OpenMP start-up costs more than it saves (≈ 15× the CPU time
        # on 1024 × 128 rows), and the analysis runs batches one after another anyway.
        with _thread_pools().limit(limits=1, user_api="openmp"):
            from sklearn.cluster import KMeans  # scikit-learn when the analysis runs, not at start

            kmeans = KMeans(n_clusters=k, n_init=self.params.n_init,
                            random_state=side.random_state()).fit(rows)
        clusters = kmeans.labels_
        if k == 2:
            minority = int(np.argmin(np.bincount(clusters, minlength=2)))
            to_centre = distances(rows, kmeans.cluster_centers_[minority][None])[:, 0]
            return AttackResult(-to_centre, no_rows_excluded(n_rows),
                                decisions=(clusters == minority).astype(np.int64))
        # Rows = true classes, columns = clusters; the assignment maximises matched rows.
        from scipy.optimize import linear_sum_assignment  # imported here: every role's validation
        from sklearn.metrics import confusion_matrix  # imports this module, few use it

        agreement = confusion_matrix(side.class_labels_oracle(), clusters, labels=np.arange(k))
        classes, matched = linear_sum_assignment(agreement, maximize=True)
        class_of = np.empty(k, dtype=np.int64)
        class_of[matched] = classes
        return AttackResult(class_of[clusters], no_rows_excluded(n_rows))
