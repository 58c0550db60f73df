"""A party's own columns as model-ready tensors, indexed by sample id."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from splitleak.config import ExperimentConfig
from splitleak.datasets import Dataset, DatasetError, check_against_schema, subset_ids, train_test_ids
from splitleak.datasets.split import num_subset_rows, num_test_rows, scaling, standardize
from splitleak.models import InputSpec, input_spec
from splitleak.seeding import rng


@dataclass(frozen=True)
class PartyInputs:
    """Row i is sample id i; numerics standardised with train-row statistics."""

    numeric: torch.Tensor
    categorical: torch.Tensor
    spec: InputSpec
    # images: the (mean, std) they were standardised with; pixels = z·std + mean, in [0, 1]
    pixel_scale: tuple[float, float] | None = None

    @property
    def num_rows(self) -> int:
        return int(self.numeric.shape[0])

    @property
    def device(self) -> torch.device:
        return self.numeric.device

    def rows(self, sample_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of these sample ids (any device: they are moved to this one's)."""
        ids = sample_ids.to(self.device, non_blocking=True)
        if ids.dim() != 1:
            return self.numeric[ids], self.categorical[ids]
        # the same rows as indexing, at a quarter of its time on the CPU
        return self.numeric.index_select(0, ids), self.categorical.index_select(0, ids)

    def to(self, device: torch.device | str) -> PartyInputs:
        """The same rows held on `device` (kept once there: a party's batches never travel)."""
        return replace(self, numeric=self.numeric.to(device), categorical=self.categorical.to(device))


def load_party_inputs(cfg: ExperimentConfig, dataset: Dataset,
                      columns: tuple[int, int]) -> PartyInputs:
    """Load one party's column range (never labels) and prepare it for its bottom model."""
    schema = dataset.schema()
    features = dataset.features(columns)
    check_against_schema(dataset, schema, features=features)
    train_ids, _ = train_test_ids(schema.num_rows, cfg.dataset.test_fraction, cfg.run.seed)
    numeric, pixel_scale = features.numeric, None
    if numeric.size:
        if numeric.ndim == 4:
            mean, std = scaling(numeric, train_ids)
            pixel_scale = (float(mean), float(std))
        numeric = standardize(numeric, train_ids)
    return PartyInputs(
        numeric=torch.from_numpy(np.ascontiguousarray(numeric, dtype=np.float32)),
        categorical=torch.from_numpy(np.ascontiguousarray(features.categorical, dtype=np.int64)),
        spec=input_spec(schema, columns),
        pixel_scale=pixel_scale,
    )


def split_ids(cfg: ExperimentConfig, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The label party's train and test ids: the seeded split, then dataset.subset's seeded
    fraction of each. Only the label party picks batches, so the passive parties need not know
    (they scale features with the statistics of the whole train split either way)."""
    train_ids, test_ids = train_test_ids(num_rows, cfg.dataset.test_fraction, cfg.run.seed)
    subset = cfg.dataset.subset
    if subset is None:
        return train_ids, test_ids
    draw = rng(cfg.run.seed if subset.seed is None else subset.seed, "dataset_subset")
    return subset_ids(train_ids, subset.fraction, draw), subset_ids(test_ids, subset.fraction, draw)


# Train steps below which a run hardly trains and its attacks see next to nothing.
MIN_TRAIN_STEPS = 2


def train_rows(cfg: ExperimentConfig, num_rows: int) -> int:
    """How many rows `split_ids` trains on, counted without drawing them."""
    train = num_rows - num_test_rows(num_rows, cfg.dataset.test_fraction)
    subset = cfg.dataset.subset
    return train if subset is None else num_subset_rows(train, subset.fraction)


def test_rows(cfg: ExperimentConfig, num_rows: int) -> int:
    """The test split's rows an evaluation pass scores (its subset share where one is set; an
    integrity attack's share is fewer), counted without drawing them."""
    test = num_test_rows(num_rows, cfg.dataset.test_fraction)
    subset = cfg.dataset.subset
    return test if subset is None else num_subset_rows(test, subset.fraction)


def train_size_warnings(cfg: ExperimentConfig, num_rows: int) -> list[str]:
    """A warning where the split leaves fewer train batches than MIN_TRAIN_STEPS: the run hardly
    trains, and the gradient attacks, which score one batch at a time, have next to nothing
    (a batch of one row holds one class: every leak attack skips it)."""
    if num_rows < 2:
        return []  # the split refuses it
    train = train_rows(cfg, num_rows)
    batch, epochs = cfg.training.batch_size, cfg.training.epochs
    steps = -(-train // batch) * epochs
    if steps >= MIN_TRAIN_STEPS:
        return []
    subset = cfg.dataset.subset
    given = f"dataset.test_fraction = {cfg.dataset.test_fraction}" + (
        f" and dataset.subset.fraction = {subset.fraction} leave" if subset is not None else " leaves")
    if train < 2:
        scored = "a batch of one row holds one class, so every leak attack skips it"
        fix = "a smaller test_fraction" + (" or a larger subset" if subset is not None else "")
    else:
        scored = f"the leak attacks score that one batch of {min(train, batch)} rows"
        fix = "a smaller training.batch_size or more training.epochs"
    return [f"{given} {train} of the {num_rows} rows to train on: one train step "
            f"(training.batch_size = {batch}, training.epochs = {epochs}), and {scored}; give {fix}"]


def check_classes(cfg: ExperimentConfig, labels: np.ndarray, test_ids: np.ndarray,
                  num_classes: int) -> list[str]:
    """DatasetError where every row read is of one class (nothing to learn or leak), or a binary
    task's test rows are (its test AUC needs both); a warning where a multi-class task's rows
    lack some classes."""
    present = np.unique(labels)
    if present.size < 2:
        source = cfg.dataset.params.get("path", f"dataset {cfg.dataset.name}")
        larger = " (or a larger max_rows)" if "max_rows" in cfg.dataset.params else ""
        raise DatasetError(f"{source}: all {labels.size} row(s) read are of class "
                           f"{int(present[0])}, so there is nothing to learn or leak; give data "
                           f"holding more than one class{larger}")
    test = np.unique(labels[test_ids])
    if num_classes == 2 and test.size < 2:
        given = f"dataset.test_fraction = {cfg.dataset.test_fraction}" + (
            f" and dataset.subset.fraction = {cfg.dataset.subset.fraction} leave"
            if cfg.dataset.subset is not None else " leaves")
        raise DatasetError(f"{given} {test_ids.size} test row(s), all of class {int(test[0])}: "
                           "the test AUC needs both classes; give a larger test_fraction")
    if present.size < num_classes:
        return [f"dataset: the {labels.size} rows read hold {present.size} of the "
                f"{num_classes} classes ({', '.join(str(int(c)) for c in present[:20])}"
                f"{', ...' if present.size > 20 else ''}); the others are never learned or "
                "tested"]
    return []
