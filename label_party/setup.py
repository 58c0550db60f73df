"""What the label party loads before serving: labels, its own columns, the split and the plan."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from label_party.schedule import Plan, make_plan
from splitleak.config import ExperimentConfig
from splitleak.datasets import (
    Dataset,
    DatasetError,
    Schema,
    build_dataset,
    subset_ids,
    train_test_ids,
)
from splitleak.inputs import PartyInputs, load_party_inputs
from splitleak.partition import label_party_columns
from splitleak.seeding import rng


@dataclass(frozen=True)
class LabelPartyData:
    schema: Schema
    labels: np.ndarray
    own_inputs: PartyInputs | None
    train_ids: np.ndarray
    test_ids: np.ndarray
    plan: Plan

    @property
    def num_classes(self) -> int:
        return self.schema.num_classes


def load_label_party_data(cfg: ExperimentConfig, dataset: Dataset | None = None) -> LabelPartyData:
    dataset = dataset or build_dataset(cfg.dataset.name, cfg.dataset.params)
    schema = dataset.schema()
    columns = label_party_columns(cfg, schema)
    own = load_party_inputs(cfg, dataset, columns) if columns else None
    train_ids, test_ids = train_test_ids(schema.num_rows, cfg.dataset.test_fraction, cfg.run.seed)
    train_ids, test_ids = _subset(cfg, train_ids, test_ids)
    labels = dataset.labels()
    if schema.num_classes == 2:
        _check_test_classes(cfg, labels[test_ids])
    return LabelPartyData(schema, labels, own, train_ids, test_ids,
                          make_plan(cfg, train_ids.size))


def _check_test_classes(cfg: ExperimentConfig, test_labels: np.ndarray) -> None:
    """A binary task's utility is its test AUC, which needs both classes among the test rows."""
    present = np.unique(test_labels)
    if present.size < 2:
        given = f"dataset.test_fraction = {cfg.dataset.test_fraction}" + (
            f" and dataset.subset.fraction = {cfg.dataset.subset.fraction} leave"
            if cfg.dataset.subset is not None else " leaves")
        raise DatasetError(f"{given} {test_labels.size} test row(s), all of class "
                           f"{int(present[0])}: the test AUC needs both classes; give a larger "
                           "test_fraction")


def _subset(cfg: ExperimentConfig, train_ids: np.ndarray,
            test_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """dataset.subset: the same seeded fraction of the train and of the test rows. Only the label
    party picks batches, so the passive parties need not know (they scale features with the
    statistics of the whole train split either way)."""
    subset = cfg.dataset.subset
    if subset is None:
        return train_ids, test_ids
    draw = rng(cfg.run.seed if subset.seed is None else subset.seed, "dataset_subset")
    return subset_ids(train_ids, subset.fraction, draw), subset_ids(test_ids, subset.fraction, draw)


def plan_record(data: LabelPartyData, passive_parties: int, seed: int) -> dict:
    """The first metrics record of a run: what will be trained."""
    return {"type": "plan", **data.plan.__dict__, "passive_parties": passive_parties,
            "num_classes": data.num_classes, "train_rows": int(data.train_ids.size),
            "test_rows": int(data.test_ids.size), "seed": seed}
