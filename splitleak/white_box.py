"""White-box snapshots: a party's model at the steps a white-box attacker knows it, an
evaluation-only artifact the party writes, never sent on the wire.

EXACT (Qiu et al.): at a snapshot step (threat.snapshot_step) the label party writes the parameters
it computes that step's cut gradient with (top model and its own bottom, before the step's update)
to `label_party/white_box/step-<step>.arrow`. CAFE (Jin et al.): a victim passive party writes its
bottom's parameters before the step's update, their aggregated gradients (`grad.<name>`) and the
cut gradient it received (`cut_gradient`) to `passive_party_<k>/white_box/step-<step>.arrow`, with
the batch's sample ids. One Arrow IPC file per step, written atomically (rows: name, shape, float32
values; schema metadata: epoch, step, and sample ids as JSON). Size: min(steps, max_snapshots) x
(the parameter count, twice for CAFE, plus a batch of cut gradients) x 4 bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from splitleak.config import ConfigError, ExperimentConfig
from splitleak.datasets.base import Schema
from splitleak.fileio import write_atomically
from splitleak.partition import label_party_columns
from splitleak.threat import ThreatConfig

FILE = re.compile(r"^step-(\d{8,})\.arrow$")
FEATURE_PREFIX = "feature."  # the label export's columns of the label party's own feature values


@dataclass(frozen=True)
class OwnColumns:
    """The label party's own columns by schema name, and which categoricals EXACT enumerates."""

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    cardinalities: tuple[int, ...]
    private: tuple[int, ...]  # indices into `categorical`

    @property
    def private_names(self) -> list[str]:
        return [self.categorical[i] for i in self.private]

    @property
    def private_cardinalities(self) -> list[int]:
        return [self.cardinalities[i] for i in self.private]


def own_columns(cfg: ExperimentConfig, schema: Schema) -> OwnColumns:
    """Resolve threat.white_box.private_features against the label party's slice of `schema`."""
    columns = label_party_columns(cfg, schema)
    if columns is None or schema.image_shape is not None:
        raise ConfigError("threat.white_box: EXACT needs a tabular label party slice "
                          "(features.label_party on a tabular dataset)")
    start, stop = columns
    p = len(schema.numeric_names)
    numeric = tuple(schema.numeric_names[start:min(stop, p)])
    first, last = max(start, p) - p, max(stop, p) - p
    categorical = tuple(schema.categorical_names[first:last])
    cardinalities = tuple(schema.cardinalities[first:last])
    wanted = cfg.threat.white_box.private_features or list(categorical)
    unknown = [name for name in wanted if name not in categorical]
    if unknown or not wanted:
        allowed = ", ".join(categorical) or "none: features.label_party holds no categorical column"
        raise ConfigError(f"threat.white_box.private_features names {unknown or '[]'}; allowed: "
                          f"categorical columns of features.label_party ({allowed})")
    return OwnColumns(numeric, categorical, cardinalities,
                      tuple(categorical.index(name) for name in dict.fromkeys(wanted)))


def cafe_victim(cfg: ExperimentConfig, party_id: int) -> bool:
    """Passive party `party_id` shares its bottom and gradients per snapshot step (CAFE)."""
    receiver = cfg.threat.receiver
    return receiver.cafe and party_id in receiver.victims


def snapshot_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.arrow"


class SnapshotWriter:
    """Writes the label party's parameters at the snapshot steps of a white-box threat model."""

    def __init__(self, directory: Path, threat: ThreatConfig) -> None:
        self.directory = directory
        self.threat = threat

    def record(self, epoch: int, step: int, model: torch.nn.Module,
               extra: dict[str, torch.Tensor] | None = None,
               sample_ids: np.ndarray | None = None) -> None:
        """Snapshot `model` (and the `extra` tensors) if `step` is a snapshot step; call before
        the step's update."""
        if not self.threat.snapshot_step(step):
            return
        state = {**model.state_dict(), **(extra or {})}
        values = [t.detach().to("cpu", torch.float32).reshape(-1).numpy() for t in state.values()]
        metadata = {"epoch": str(epoch), "step": str(step)}
        if sample_ids is not None:
            metadata["sample_ids"] = json.dumps(np.asarray(sample_ids).tolist())
        table = pa.table({
            "name": pa.array(list(state), pa.string()),
            "shape": pa.array([list(t.shape) for t in state.values()], pa.list_(pa.int64())),
            "values": pa.array(values, pa.list_(pa.float32())),
        }).replace_schema_metadata(metadata)
        self.directory.mkdir(parents=True, exist_ok=True)

        def write(tmp: Path) -> None:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)

        write_atomically(snapshot_path(self.directory, step), write)

    def keep_before(self, step: int) -> None:
        """A resumed run redoes the steps from `step` on: their snapshots are written anew."""
        for found, path in snapshot_files(self.directory).items():
            if found >= step:
                path.unlink(missing_ok=True)


def snapshot_files(directory: Path) -> dict[int, Path]:
    """Train step -> its snapshot file, for the complete files in `directory`."""
    if not directory.is_dir():
        return {}
    found = {}
    for path in directory.iterdir():
        match = FILE.match(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def read_snapshot(path: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """(train step, state dict) of one snapshot; ValueError naming the file if unreadable."""
    step, state, _ = read_snapshot_batch(path)
    return step, state


def read_snapshot_batch(path: Path) -> tuple[int, dict[str, torch.Tensor], np.ndarray | None]:
    """(train step, tensors, the batch's sample ids if recorded) of one snapshot; ValueError
    naming the file if unreadable."""
    try:
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
        metadata = table.schema.metadata
        step = int(metadata[b"step"])
        ids = (np.asarray(json.loads(metadata[b"sample_ids"]), dtype=np.int64)
               if b"sample_ids" in metadata else None)
        state = {}
        for name, shape, values in zip(table.column("name").to_pylist(), table.column("shape").to_pylist(),
                                       table.column("values").to_pylist(), strict=True):
            state[name] = torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(shape))
    except (pa.ArrowException, OSError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a readable white-box snapshot: {err}") from None
    return step, state, ids
