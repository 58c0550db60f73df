"""What the label party leaves in the run directory when training ends."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from label_party.setup import LabelPartyData
from label_party.trainer import LabelPartyTrainer
from splitleak.anchors import CleanAnchorWriter
from splitleak.artifacts.paths import RunDir
from splitleak.checkpoint import save_torch
from splitleak.config import ExperimentConfig
from splitleak.fileio import write_atomically
from splitleak.white_box import FEATURE_PREFIX, SnapshotWriter, own_columns


def write_labels(run: RunDir, data: LabelPartyData, cfg: ExperimentConfig) -> None:
    """Evaluation-only ground truth for the offline leak analysis (never sent on the wire); a
    white-box threat model adds the label party's own feature values (`feature.<name>`: the
    private categoricals EXACT is scored against, and the columns it assumes known)."""
    ids = np.concatenate([data.train_ids, data.test_ids])
    split = np.array(["train"] * data.train_ids.size + ["test"] * data.test_ids.size)
    columns = {"sample_id": ids, "label": data.labels[ids], "split": split}
    if cfg.artifacts.white_box_snapshots and data.own_inputs is not None:
        own = own_columns(cfg, data.schema)
        numeric = data.own_inputs.numeric.numpy()[ids]
        categorical = data.own_inputs.categorical.numpy()[ids]
        columns |= {FEATURE_PREFIX + name: numeric[:, i] for i, name in enumerate(own.numeric)}
        columns |= {FEATURE_PREFIX + name: categorical[:, i] for i, name in enumerate(own.categorical)}
    table = pa.table(columns)
    write_atomically(run.labels, lambda tmp: pq.write_table(table, tmp))


def snapshot_writer(run: RunDir, cfg: ExperimentConfig) -> SnapshotWriter | None:
    """The white-box snapshots' writer when the threat model has a white-box attacker."""
    return SnapshotWriter(run.white_box, cfg.threat) if cfg.artifacts.white_box_snapshots else None


def clean_anchor_writer(run: RunDir, cfg: ExperimentConfig) -> CleanAnchorWriter | None:
    """The clean-anchor artifact's writer when the resolved config names parties for it."""
    parties = cfg.artifacts.clean_anchors
    return CleanAnchorWriter(run.clean_anchors, cfg, parties) if parties else None


def write_outputs(run: RunDir, trainer: LabelPartyTrainer) -> None:
    """What training leaves (the labels were written when it started)."""
    save_torch(run.top_model, trainer.model_state())


