"""Integrity attacks of a malicious passive party (VFLAIR's backdoor and non-targeted families,
ALGORITHMS.md §2.16-2.18): the rows the label party's evaluation scores under each, and the seeded
draws the attacking party and the evaluation share. Absent from [threat]: nothing here runs."""

from __future__ import annotations

import numpy as np

from splitleak.config import ConfigError, ExperimentConfig
from splitleak.datasets import Dataset, Schema
from splitleak.inputs import split_ids
from splitleak.models import input_spec
from splitleak.partition import passive_columns
from splitleak.seeding import rng
from splitleak.threat import MissingFeatures, ReplacementBackdoor, ThreatConfig

# EVAL batch variants (the wire's Batch.variant; "" = clean rows) and the share of the test rows
# each scores, by the setting that gives it.
VARIANTS = {"backdoor": "poison_fraction", "noisy": "noise_rate", "missing": "missing_rate"}


def variant_rows(threat: ThreatConfig, test_ids: np.ndarray, seed: int) -> list[tuple[str, np.ndarray]]:
    """(variant, test rows) of every integrity attack the threat model declares, in VARIANTS'
    order: a seeded share of the test rows (at least one), the same in every evaluation."""
    found = []
    for variant, share in VARIANTS.items():
        declared = threat.integrity_party(variant)
        if declared is None or test_ids.size == 0:
            continue
        size = min(max(1, round(getattr(declared[1], share) * test_ids.size)), test_ids.size)
        draw = rng(seed, "integrity", variant, "test rows")
        found.append((variant, np.sort(draw.choice(test_ids, size=size, replace=False))))
    return found


def check_integrity(cfg: ExperimentConfig, schema: Schema) -> None:
    """What the schema decides: the backdoor's target class exists, and the parties running
    the backdoor or noisy samples hold numeric (or image) columns to alter; ConfigError."""
    declared = cfg.threat.integrity_party("backdoor")
    if declared is not None and declared[1].target_class >= schema.num_classes:
        raise ConfigError(f"threat.parties.{declared[0]}.backdoor.target_class = "
                          f"{declared[1].target_class}, but {cfg.dataset.name} has classes "
                          f"0..{schema.num_classes - 1}")
    columns = passive_columns(cfg, schema)
    for variant, field in (("backdoor", "backdoor"), ("noisy", "noisy_samples")):
        found = cfg.threat.integrity_party(variant)
        if found is not None and input_spec(schema, columns[found[0]]).num_numeric == 0 \
                and schema.image_shape is None:
            raise ConfigError(f"threat.parties.{found[0]}.{field}: party {found[0]} holds no "
                              "numeric column to trigger or add noise to (only categorical ones)")


def known_targets(cfg: ExperimentConfig, dataset: Dataset, party_id: int,
                  settings: ReplacementBackdoor) -> np.ndarray:
    """The target-class train rows the backdoor party knows: its declared side knowledge (as
    labelled_per_class is model completion's), drawn with its side-knowledge seed. The only
    label-derived input of a passive party, and only when [threat] declares the backdoor. Drawn
    from the rows the label party trains on (dataset.subset's share of the train split)."""
    schema = dataset.schema()
    check_integrity(cfg, schema)
    train_ids, _ = split_ids(cfg, schema.num_rows)
    labels = dataset.labels()
    targets = train_ids[labels[train_ids] == settings.target_class]
    if targets.size == 0:
        raise ConfigError(f"threat.parties.{party_id}.backdoor.target_class = "
                          f"{settings.target_class}: no train row has that class")
    draw = rng(cfg.threat.side_seed(party_id, cfg.run.seed), "backdoor", "targets", party_id)
    size = min(settings.known_targets, targets.size)
    return np.sort(draw.choice(targets, size=size, replace=False))


def poisoned_rows(cfg: ExperimentConfig, num_rows: int, party_id: int,
                  settings: ReplacementBackdoor) -> np.ndarray:
    """The train rows the backdoor party triggers and swaps in for its known targets: a share of
    the rows the label party trains on (dataset.subset's share of the train split)."""
    train_ids, _ = split_ids(cfg, num_rows)
    size = min(max(1, round(settings.poison_fraction * train_ids.size)), train_ids.size)
    draw = rng(cfg.run.seed, "backdoor", "poisoned", party_id)
    return np.sort(draw.choice(train_ids, size=size, replace=False))


def missing_mask(seed: int, party_id: int, step: int, rows: int,
                 settings: MissingFeatures) -> np.ndarray:
    """Which rows of train step `step`'s batch the party sends as missing (VFLAIR: a random
    ⌊rate·B⌋ of every batch), seeded by the run seed, party and step."""
    mask = np.zeros(rows, dtype=bool)
    chosen = rng(seed, "missing_features", party_id, step).choice(
        rows, size=int(settings.missing_rate * rows), replace=False)
    mask[chosen] = True
    return mask
