"""attacker/gradients/index.json: the gradient log's index (each party's tensor shapes and
shards), written atomically by the sidecar and read by the analysis; its model, writer and
reader. The shards themselves are Arrow IPC streams that plain pyarrow reads."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, field_validator

from splitleak.artifacts.artifact import read_versioned

FORMAT = 1  # the log's layout; a reader refuses another


class LogIndexError(ValueError):
    """An index that cannot be read, or of another format."""


class Shard(BaseModel):
    file: str  # relative to the log's folder: party_<k>/shard-<n>.arrows
    records: int
    rows: int


class PartyLog(BaseModel):
    shapes: dict[str, list[int]]  # tensor name -> shape of one row
    shards: list[Shard] = []


class GradientLogIndex(BaseModel):
    format: int = FORMAT
    run_id: str = ""
    parties: dict[str, PartyLog] = {}  # by party id

    @field_validator("parties")
    @classmethod
    def _party_ids(cls, parties: dict[str, PartyLog]) -> dict[str, PartyLog]:
        bad = next((key for key in parties if not (key.isascii() and key.isdigit())), None)
        if bad is not None:
            raise ValueError(f"party ids are whole numbers such as \"1\", not {bad!r}")
        return parties


def write_index_text(index: GradientLogIndex) -> str:
    """The index as the sidecar writes it (indented JSON, fields in their declared order)."""
    return json.dumps(index.model_dump(), indent=1)


def read_index(path: Path) -> GradientLogIndex:
    """LogIndexError naming the file when it is not an index of this format; OSError as raised."""
    return read_versioned(path, GradientLogIndex, FORMAT, LogIndexError, "gradient log index")
