"""checkpoints/step-<t>-batch-<b>/manifest.json: a complete checkpoint's manifest, written last by
the label party and read by every resume; its model, writer and reader."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from splitleak.artifacts.artifact import read_versioned
from splitleak.artifacts.paths import CHECKPOINT_MANIFEST, RunDir
from splitleak.fileio import write_atomically

FORMAT = 1  # the manifest's layout; a resume refuses another


@dataclass(frozen=True)
class Position:
    """Where a run stands in its seeded batch schedule."""

    step: int  # train steps completed
    batches: int  # schedule batches (train and eval) completed


class ManifestError(ValueError):
    """A manifest that cannot be read, or of another format."""


class DataFile(BaseModel):
    """A data file a run reads, as it was when the run read it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str  # absolute
    size: int
    mtime_ns: int


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int
    batches: int
    metrics_records: int  # lines of label_party/metrics.jsonl at this position
    run_id: str
    config_hash: str
    config: dict[str, Any]  # the resolved config, to name what a resume would change
    files: dict[str, str]  # file name in the step directory -> SHA-256
    recorded: dict[str, int] = {}  # observed party -> log records
    data: dict[str, DataFile] = {}  # dataset.params.<name> -> the file it named (none: not checked)
    reason: str = "periodic"  # periodic | interrupted | failed
    format: int = FORMAT

    @property
    def position(self) -> Position:
        return Position(self.step, self.batches)

    def folder(self, run: RunDir) -> Path:
        return run.checkpoint(self.step, self.batches)


def write_manifest(run: RunDir, manifest: Manifest) -> Path:
    """The manifest, atomically, into its checkpoint's folder (the checkpoint is then complete)."""
    path = manifest.folder(run) / CHECKPOINT_MANIFEST
    text = json.dumps(manifest.model_dump(), indent=1, sort_keys=True)
    write_atomically(path, lambda tmp: tmp.write_text(text))
    return path


def read_manifest(path: Path) -> Manifest:
    """ManifestError naming the file when it cannot be read or has another format."""
    try:
        return read_versioned(path, Manifest, FORMAT, ManifestError, "checkpoint manifest")
    except OSError as err:
        raise ManifestError(f"{path} is not a readable checkpoint manifest: {err}") from None
