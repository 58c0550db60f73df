"""The gradient log: append-only Arrow IPC shards per party plus an atomically written index.

A record batch is flushed to the OS as soon as it is written, so a killed sidecar loses at
most the record it was writing; the reader detects such a torn tail and keeps the rest.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from splitleak.fileio import write_atomically

log = logging.getLogger("attacker")
INDEX = "index.json"
FORMAT = 1
_SUFFIX = ".arrows"  # Arrow IPC streaming format


class RecordError(ValueError):
    """A record that cannot go into the log (wrong party, shape change, bad tensor).

    `status` names the gRPC status code the sidecar answers with."""

    def __init__(self, message: str, status: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.status = status


def _vectors(rows: np.ndarray) -> pa.FixedSizeListArray:
    """Rows as fixed-size lists; a contiguous float32 input (e.g. a view of received bytes)
    is wrapped without a copy."""
    flat = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1)
    width = flat.size // rows.shape[0] if rows.shape[0] else 0
    return pa.FixedSizeListArray.from_arrays(pa.array(flat), width)


@dataclass
class _PartyWriter:
    party_id: int
    root: Path
    shard_bytes: int
    shapes: dict[str, list[int]]
    schema: pa.Schema
    shards: list[dict[str, Any]] = field(default_factory=list)
    _sink: Any = None
    _writer: Any = None

    def _open_shard(self) -> None:
        name = f"party_{self.party_id}/shard-{len(self.shards):06d}{_SUFFIX}"
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)
        self.shards.append({"file": name, "records": 0, "rows": 0})

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None or self._sink.tell() >= self.shard_bytes:
            self.close()
            self._open_shard()
        self._writer.write_batch(batch)
        self._sink.flush()
        self.shards[-1]["records"] += 1
        self.shards[-1]["rows"] += batch.num_rows

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None


class GradientStore:
    """Writes what the sidecar receives; one shard sequence per observed party."""

    def __init__(self, root: Path, run_id: str, shard_bytes: int = 64 << 20,
                 index_interval: float = 1.0) -> None:
        self.root = root
        self.run_id = run_id
        self.shard_bytes = shard_bytes
        self.index_interval = index_interval
        self.parties: dict[int, _PartyWriter] = {}
        self._index_written = 0.0
        root.mkdir(parents=True, exist_ok=True)
        if (root / INDEX).exists() or any(root.glob(f"party_*/*{_SUFFIX}")):
            raise RecordError(f"{root} already holds a gradient log; give the sidecar an empty "
                              "directory (the log is append-only and is never overwritten)")
        self.write_index()

    def append(self, party_id: int, epoch: int, step: int, sample_ids: np.ndarray,
               tensors: dict[str, np.ndarray]) -> int:
        """Append one received batch; `tensors` maps column name -> [B, *shape] float32."""
        shapes = {name: list(t.shape[1:]) for name, t in tensors.items()}
        writer = self.parties.get(party_id)
        if writer is None:
            fields = [pa.field("sample_id", pa.int64()), pa.field("epoch", pa.int32()),
                      pa.field("step", pa.int64())]
            fields += [pa.field(name, pa.list_(pa.float32(), int(np.prod(shape))))
                       for name, shape in shapes.items()]
            writer = self.parties[party_id] = _PartyWriter(
                party_id, self.root, self.shard_bytes, shapes, pa.schema(fields))
        elif shapes != writer.shapes:
            raise RecordError(f"passive party {party_id}, step {step}: tensors {shapes} differ "
                              f"from the shapes recorded so far {writer.shapes}")
        rows = sample_ids.shape[0]
        columns = [pa.array(sample_ids, pa.int64()), pa.array(np.full(rows, epoch, np.int32)),
                   pa.array(np.full(rows, step, np.int64))]
        columns += [_vectors(tensors[name]) for name in shapes]
        writer.write(pa.RecordBatch.from_arrays(columns, schema=writer.schema))
        if time.monotonic() - self._index_written > self.index_interval:
            self.write_index()
        return rows

    def write_index(self) -> None:
        index = {"format": FORMAT, "run_id": self.run_id, "parties": {
            str(k): {"shapes": w.shapes, "shards": w.shards} for k, w in self.parties.items()}}
        text = json.dumps(index, indent=1)
        write_atomically(self.root / INDEX, lambda tmp: tmp.write_text(text))
        self._index_written = time.monotonic()

    def close(self) -> None:
        for writer in self.parties.values():
            writer.close()
        self.write_index()


@dataclass(frozen=True)
class LoggedBatch:
    """One received batch as read back: column name -> float32 [B, d] (flattened)."""

    party_id: int
    epoch: int
    step: int
    sample_ids: np.ndarray
    tensors: dict[str, np.ndarray]


class GradientLog:
    """Reads a gradient log in streaming batches; memory is one record batch at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        index_path = root / INDEX
        if not index_path.exists():
            raise FileNotFoundError(f"no gradient log at {root} (missing {INDEX})")
        self.index = json.loads(index_path.read_text())
        if self.index.get("format") != FORMAT:
            raise ValueError(f"{index_path}: unsupported log format {self.index.get('format')}")
        self.warnings: list[str] = []

    @property
    def run_id(self) -> str:
        return str(self.index.get("run_id", ""))

    def parties(self) -> list[int]:
        on_disk = {int(p.name.split("_", 1)[1]) for p in self.root.glob("party_*") if p.is_dir()}
        return sorted(on_disk | {int(k) for k in self.index["parties"]})

    def shapes(self, party_id: int) -> dict[str, list[int]]:
        entry = self.index["parties"].get(str(party_id))
        return dict(entry["shapes"]) if entry else {}

    def _shards(self, party_id: int) -> list[Path]:
        # Shards written after the last index update are found on disk, in order.
        return sorted((self.root / f"party_{party_id}").glob(f"shard-*{_SUFFIX}"))

    def batches(self, party_id: int) -> Iterator[LoggedBatch]:
        for shard in self._shards(party_id):
            yield from self._read_shard(party_id, shard)

    def _read_shard(self, party_id: int, shard: Path) -> Iterator[LoggedBatch]:
        complete = 0
        try:
            with pa.OSFile(str(shard), "rb") as source:
                reader = pa.ipc.open_stream(source)
                while True:
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        return
                    complete += 1
                    yield _logged(party_id, batch)
        except (pa.ArrowInvalid, OSError) as err:
            message = (f"{shard}: truncated tail after {complete} complete record(s) "
                       f"(the sidecar stopped mid-write?): {err}; analysing the complete ones")
            log.warning(message)
            self.warnings.append(message)


def _logged(party_id: int, batch: pa.RecordBatch) -> LoggedBatch:
    columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
    tensors = {}
    for name, column in columns.items():
        if name in ("sample_id", "epoch", "step"):
            continue
        width = column.type.list_size
        tensors[name] = column.values.to_numpy(zero_copy_only=False).reshape(-1, width)
    return LoggedBatch(party_id, int(columns["epoch"][0].as_py()), int(columns["step"][0].as_py()),
                       columns["sample_id"].to_numpy(), tensors)
