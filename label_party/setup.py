"""What the label party loads before serving: labels, its own columns, the split and the plan."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from label_party.schedule import Plan, make_plan
from splitleak.config import ExperimentConfig
from splitleak.datasets import Dataset, Schema, build_dataset, check_against_schema
from splitleak.inputs import PartyInputs, check_classes, load_party_inputs, split_ids
from splitleak.partition import label_party_columns


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
    train_ids, test_ids = split_ids(cfg, schema.num_rows)
    labels = dataset.labels()
    check_against_schema(dataset, schema, labels=labels)
    check_classes(cfg, labels, test_ids, schema.num_classes)
    return LabelPartyData(schema, labels, own, train_ids, test_ids,
                          make_plan(cfg, train_ids.size))


def plan_record(data: LabelPartyData, passive_parties: int, seed: int) -> dict:
    """The first metrics record of a run: what will be trained."""
    return {"type": "plan", **data.plan.__dict__, "passive_parties": passive_parties,
            "num_classes": data.num_classes, "train_rows": int(data.train_ids.size),
            "test_rows": int(data.test_ids.size), "seed": seed}
