"""Clean anchors: the pre-defense cut gradients of a few positives per batch, an evaluation-only
artifact the label party writes for the attacks that declare they need it (the cosine oracle, Li
et al. §3.3), never sent on the wire; `evaluation.clean_anchors` names the parties.

Per train step and tapped party the label party draws R = threat.draws positives of the batch
(seeded, with replacement: each draw is one independent pick of "one random positive") and
appends their sample ids and clean gradients to `label_party/clean_anchors.arrows` (Arrow IPC
stream, flushed per step). Size: steps × tapped parties × R × d × 4 bytes.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from splitleak.config import ExperimentConfig
from splitleak.fileio import naming
from splitleak.seeding import rng

SCHEMA_FIELDS = [("party_id", pa.int32()), ("epoch", pa.int32()), ("step", pa.int64()),
                 ("draw", pa.int32()), ("sample_id", pa.int64())]


def draw_anchor_rows(labels: np.ndarray, seed: int, party_id: int, step: int,
                     draws: int) -> np.ndarray:
    """Row indices (within the batch) of `draws` positives picked at random; empty if none."""
    positives = np.flatnonzero(np.asarray(labels) == 1)
    if positives.size == 0:
        return positives
    return rng(seed, "clean_anchor", party_id, step).choice(positives, size=draws, replace=True)


class CleanAnchorWriter:
    """Appends one record batch per (step, party); the file stays readable up to the last one."""

    def __init__(self, path: Path, cfg: ExperimentConfig, parties: list[int]) -> None:
        self.path = path
        self.parties = set(parties)
        self.draws = cfg.threat.draws
        self.seeds = {k: cfg.threat.side_seed(k, cfg.run.seed) for k in parties}
        self._sink: pa.OSFile | None = None  # both open while the stream is
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._width: int | None = None

    def record(self, party_id: int, epoch: int, step: int, sample_ids: np.ndarray,
               labels: np.ndarray, clean_gradient: np.ndarray) -> None:
        if party_id not in self.parties:
            return
        rows = draw_anchor_rows(labels, self.seeds[party_id], party_id, step, self.draws)
        if rows.size == 0:
            return
        gradients = np.ascontiguousarray(clean_gradient[rows], dtype=np.float32).reshape(rows.size, -1)
        n = rows.size
        columns = [pa.array(np.full(n, party_id, np.int32)), pa.array(np.full(n, epoch, np.int32)),
                   pa.array(np.full(n, step, np.int64)), pa.array(np.arange(n, dtype=np.int32)),
                   pa.array(np.asarray(sample_ids)[rows].astype(np.int64)),
                   pa.FixedSizeListArray.from_arrays(pa.array(gradients.reshape(-1)),
                                                     gradients.shape[1])]
        batch = pa.RecordBatch.from_arrays(columns, schema=self._schema(gradients.shape[1]))
        if self._writer is not None and gradients.shape[1] != self._width:
            raise ValueError(f"party {party_id} step {step}: clean gradient width "
                             f"{gradients.shape[1]} differs from the anchors written so far")
        with naming(self.path):  # pyarrow's errors name no file (e.g. a full disk)
            if self._writer is None or self._sink is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._sink = pa.OSFile(str(self.path), "wb")
                self._writer = pa.ipc.new_stream(self._sink, batch.schema)
                self._width = gradients.shape[1]
            self._writer.write_batch(batch)
            self._sink.flush()

    def keep_before(self, step: int) -> None:
        """Keep only the records of train steps before `step` (a resumed run redoes the rest,
        and a torn tail goes too), rewritten atomically; later records append after them."""
        kept: list[pa.RecordBatch] = []
        if self.path.exists():
            try:
                with pa.OSFile(str(self.path), "rb") as source:
                    for batch in pa.ipc.open_stream(source):
                        if batch.column("step")[0].as_py() < step:
                            kept.append(batch)
            except (pa.ArrowInvalid, OSError):
                pass  # a torn tail: the complete records before it are kept
        self.close()
        if not kept:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with naming(self.path):
            self._sink = pa.OSFile(str(tmp), "wb")
            self._writer = pa.ipc.new_stream(self._sink, kept[0].schema)
            for batch in kept:
                self._writer.write_batch(batch)
            self._sink.flush()
            os.replace(tmp, self.path)
        self._width = kept[0].schema.field("gradient").type.list_size

    @staticmethod
    def _schema(width: int) -> pa.Schema:
        return pa.schema([*SCHEMA_FIELDS, ("gradient", pa.list_(pa.float32(), width))])

    def close(self) -> None:
        if self._writer is not None and self._sink is not None:
            writer, sink, self._writer, self._sink = self._writer, self._sink, None, None
            with naming(self.path):
                writer.close()
                sink.close()


@dataclass(frozen=True)
class BatchAnchors:
    """One (party, step): the sample id and clean gradient of each draw, in draw order."""

    sample_ids: np.ndarray  # int64 [R]
    gradients: np.ndarray  # float32 [R, d]


def _batches(path: Path) -> Generator[pa.RecordBatch, None, None]:
    """The file's record batches, one (party, step) each, read one at a time;
    raises ArrowInvalid / OSError at a torn tail, after the complete ones."""
    with pa.OSFile(str(path), "rb") as source:
        yield from pa.ipc.open_stream(source)


def _key(batch: pa.RecordBatch) -> tuple[int, int]:
    return int(batch.column("party_id")[0].as_py()), int(batch.column("step")[0].as_py())


def _anchors(batch: pa.RecordBatch) -> BatchAnchors:
    width = batch.schema.field("gradient").type.list_size
    order = np.argsort(batch.column("draw").to_numpy())
    gradients = batch.column("gradient").values.to_numpy(zero_copy_only=False)
    return BatchAnchors(batch.column("sample_id").to_numpy()[order], gradients.reshape(-1, width)[order])


def _torn(path: Path, complete: int, err: Exception) -> str:
    return (f"{path}: unreadable after {complete} complete batch(es) of clean anchors (the label "
            f"party stopped mid-write, or the file is damaged): {err}; using the complete ones")


def read_clean_anchors(path: Path) -> tuple[dict[tuple[int, int], BatchAnchors], str | None]:
    """(party, step) -> anchors, and a warning if the file ends in a torn record."""
    found: dict[tuple[int, int], BatchAnchors] = {}
    if not path.exists():
        return found, None
    try:
        for batch in _batches(path):
            found[_key(batch)] = _anchors(batch)
    except (pa.ArrowInvalid, OSError) as err:
        return found, _torn(path, len(found), err)
    return found, None


class CleanAnchors:
    """The clean anchors of a run, looked up by (party, step) while the analysis walks each
    party's batches in step order: the file is read along, holding one batch of
    anchors, not the run's (R x d floats a train step: ~2.5 KB at R = 5, d = 128). A file whose
    steps do not ascend per party is read whole instead, as before. `warning`: a torn tail."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.warning: str | None = None
        self._whole: dict[tuple[int, int], BatchAnchors] | None = None
        self._complete = 0  # batches before a torn tail: what is read
        self._reader: Generator[tuple[int, BatchAnchors], None, None] | None = None
        self._party: int | None = None
        self._current: tuple[int, BatchAnchors] | None = None  # (step, anchors) of the party
        self._asked = -1
        if path.exists() and not self._ascending():
            self._whole, self.warning = read_clean_anchors(path)

    def _ascending(self) -> bool:
        """One pass over the keys: each party's steps ascend; counts the complete batches."""
        last: dict[int, int] = {}
        try:
            for batch in _batches(self.path):
                party, step = _key(batch)
                if step <= last.get(party, -1):
                    return False
                last[party] = step
                self._complete += 1
        except (pa.ArrowInvalid, OSError) as err:
            self.warning = _torn(self.path, self._complete, err)
        return True

    def get(self, key: tuple[int, int]) -> BatchAnchors | None:
        """The anchors of (party, step), or None if the run wrote none for it."""
        if self._whole is not None:
            return self._whole.get(key)
        party, step = key
        if not self._complete:
            return None
        if party != self._party or step < self._asked:  # another party, or back: read anew
            self.close()
            self._reader, self._party, self._current = self._party_batches(party), party, None
        self._asked = step
        while self._current is None or self._current[0] < step:
            found = next(self._reader, None) if self._reader is not None else None
            if found is None:
                self._reader = None
                return None
            self._current = found
        return self._current[1] if self._current[0] == step else None

    def close(self) -> None:
        """Close the file if a party's batches are being read."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _party_batches(self, party: int) -> Generator[tuple[int, BatchAnchors], None, None]:
        batches = _batches(self.path)
        try:
            for _, batch in zip(range(self._complete), batches, strict=False):
                found, step = _key(batch)
                if found == party:
                    yield step, _anchors(batch)
        finally:
            batches.close()
