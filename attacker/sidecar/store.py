"""The gradient log: append-only Arrow IPC shards per party plus an atomically written index.

A record batch is flushed to the OS as soon as it is written, so a killed sidecar loses at
most the record it was writing; a shard always ends at a record boundary otherwise (a failed
write is cut back), so plain pyarrow reads it. A torn tail (a kill in mid-write) is cut back
when the log is reopened (`--resume`); a reader (`GradientLog`, the analysis) never changes the
log: it reads the complete records and warns of the rest.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from splitleak.artifacts.gradient_index import (
    GradientLogIndex,
    LogIndexError,
    PartyLog,
    Shard,
    read_index,
    write_index_text,
)
from splitleak.artifacts.gradient_shards import SHARD_SUFFIX
from splitleak.artifacts.gradient_shards import ShardPrefix as _Prefix
from splitleak.artifacts.gradient_shards import shard_prefix as _prefix
from splitleak.artifacts.paths import GRADIENT_LOG_INDEX
from splitleak.fileio import NO_SPACE, describe_os_error, name_file, naming, write_atomically

log = logging.getLogger("attacker")
INDEX = GRADIENT_LOG_INDEX
LOCK = ".writer.lock"  # held by the process writing the log
_SUFFIX = SHARD_SUFFIX
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class RecordError(ValueError):
    """A record that cannot go into the log (wrong party, shape change, bad tensor, no space).

    `status` names the gRPC status code the sidecar answers with."""

    def __init__(self, message: str, status: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.status = status


class LogFormatError(ValueError):
    """A gradient log whose index cannot be read."""


def _vectors(rows: np.ndarray) -> pa.FixedSizeListArray:
    """Rows as fixed-size lists; a contiguous float32 input (e.g. a view of received bytes)
    is wrapped without a copy."""
    flat = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1)
    width = flat.size // rows.shape[0] if rows.shape[0] else 0
    return pa.FixedSizeListArray.from_arrays(pa.array(flat), width)


def _cut(path: Path, prefix: _Prefix) -> bool:
    """Keep only `prefix` of a shard (an empty one is removed); True if it was changed."""
    if prefix.whole:
        return False
    if prefix.records == 0:
        path.unlink()
    else:
        os.truncate(path, prefix.end)
    return True


@dataclass
class _PartyWriter:
    party_id: int
    root: Path
    shard_bytes: int
    shapes: dict[str, list[int]]
    schema: pa.Schema
    shards: list[dict[str, Any]] = field(default_factory=list)
    last_step: int | None = None
    _file: Any = None
    _writer: Any = None
    _path: Path | None = None
    _good = 0  # bytes of the open shard up to its last complete record

    @property
    def records(self) -> int:
        return sum(s["records"] for s in self.shards)

    @property
    def rows(self) -> int:
        return sum(s["rows"] for s in self.shards)

    def _open_shard(self) -> None:
        number = int(self.shards[-1]["file"].rsplit("-", 1)[1].split(".")[0]) + 1 if self.shards else 0
        name = f"party_{self.party_id}/shard-{number:06d}{_SUFFIX}"
        self._path = self.root / name
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # Buffered, and flushed after each record: a short write (a disk filling up) is
        # retried and then raised, never silently dropped.
        self._file = self._path.open("wb")
        self._writer = pa.ipc.new_stream(self._file, self.schema)
        self._good = 0
        self.shards.append({"file": name, "records": 0, "rows": 0})

    def write(self, batch: pa.RecordBatch, step: int) -> None:
        if self._writer is None or self._good >= self.shard_bytes:
            self.close()
            self._open_shard()
        try:
            self._writer.write_batch(batch)
            self._file.flush()
        except OSError as err:
            self._abandon()
            assert self._path is not None
            name_file(err, self._path)  # the flush's error names no file
            raise
        self._good = self._file.tell()
        self.shards[-1]["records"] += 1
        self.shards[-1]["rows"] += batch.num_rows
        self.last_step = step

    def _abandon(self) -> None:
        """A write failed (e.g. no space): cut the open shard back to its last complete
        record, so it stays a readable stream; the next record starts a new shard."""
        with contextlib.suppress(OSError):  # what is still buffered cannot be written either
            self._file.close()  # first: the stream writer must not write into the file any more
        self._writer = None
        assert self._path is not None
        os.truncate(self._path, self._good)
        if self.shards[-1]["records"] == 0:
            self._path.unlink()
            self.shards.pop()

    def sync(self) -> None:
        if self._file is not None:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._writer is not None:
            assert self._path is not None
            with naming(self._path):
                self._writer.close()
                self._file.close()
            self._writer = self._file = None


class GradientStore:
    """Writes what the sidecar receives; one shard sequence per observed party.

    `resume`: continue a log already in `root` (its torn tails cut back); otherwise `root`
    must hold no log, since the log is never overwritten."""

    def __init__(self, root: Path, run_id: str, shard_bytes: int = 64 << 20,
                 index_interval: float = 1.0, resume: bool = False) -> None:
        self.root = root
        self.run_id = run_id
        self.shard_bytes = shard_bytes
        self.index_interval = index_interval
        self.parties: dict[int, _PartyWriter] = {}
        self._index_written = 0.0
        root.mkdir(parents=True, exist_ok=True)
        self._lock = (root / LOCK).open("a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RecordError(f"another sidecar is writing the gradient log at {root}",
                              status="FAILED_PRECONDITION") from None
        existing = (root / INDEX).exists() or any(root.glob(f"party_*/*{_SUFFIX}"))
        if existing and not resume:
            raise RecordError(f"{root} already holds a gradient log; give the sidecar an empty "
                              "directory (the log is append-only and is never overwritten), "
                              "or resume the run with --resume")
        if existing:
            self._reopen()
        self.write_index()

    def _reopen(self) -> None:
        try:
            index = read_index(self.root / INDEX) if (self.root / INDEX).exists() else None
        except LogIndexError as err:  # the shards are scanned anyway; their schema gives the shapes
            log.warning("%s; it is written anew from the log's shards", err)
            index = None
        shapes = {int(k): v.shapes for k, v in index.parties.items()} if index else {}
        for directory in sorted(self.root.glob("party_*")):
            party = int(directory.name.split("_", 1)[1])
            writer = None
            for shard in sorted(directory.glob(f"shard-*{_SUFFIX}")):
                prefix = _prefix(shard)
                if _cut(shard, prefix):
                    log.warning("%s: cut back to its %d complete record(s)", shard, prefix.records)
                if prefix.records == 0 or prefix.schema is None:
                    continue
                if writer is None:
                    names = [f.name for f in prefix.schema][3:]
                    writer = _PartyWriter(party, self.root, self.shard_bytes,
                                          shapes.get(party) or {n: [prefix.schema.field(n).type.list_size]
                                                                for n in names}, prefix.schema)
                writer.shards.append({"file": f"{directory.name}/{shard.name}",
                                      "records": prefix.records, "rows": prefix.rows})
                writer.last_step = prefix.last_step
            if writer is not None:
                self.parties[party] = writer

    def _batch(self, party_id: int, epoch: int, step: int, sample_ids: np.ndarray,
               tensors: dict[str, np.ndarray]) -> tuple[pa.RecordBatch, dict[str, list[int]]]:
        shapes = {name: list(t.shape[1:]) for name, t in tensors.items()}
        writer = self.parties.get(party_id)
        if writer is not None and shapes != writer.shapes:
            raise RecordError(f"passive party {party_id}, step {step}: tensors {shapes} differ "
                              f"from the shapes recorded so far {writer.shapes}")
        if writer is not None and writer.last_step is not None and step <= writer.last_step:
            raise RecordError(f"passive party {party_id}: a record of step {step} after one of "
                              f"step {writer.last_step} (each train step is logged once, in "
                              "order; a resumed run rewinds the log first)",
                              status="FAILED_PRECONDITION")
        fields = [pa.field("sample_id", pa.int64()), pa.field("epoch", pa.int32()),
                  pa.field("step", pa.int64())]
        fields += [pa.field(name, pa.list_(pa.float32(), int(np.prod(shape))))
                   for name, shape in shapes.items()]
        schema = writer.schema if writer is not None else pa.schema(fields)
        rows = sample_ids.shape[0]
        columns = [pa.array(sample_ids, pa.int64()), pa.array(np.full(rows, epoch, np.int32)),
                   pa.array(np.full(rows, step, np.int64))]
        columns += [_vectors(tensors[name]) for name in shapes]
        return pa.RecordBatch.from_arrays(columns, schema=schema), shapes

    def append(self, party_id: int, epoch: int, step: int, sample_ids: np.ndarray,
               tensors: dict[str, np.ndarray]) -> int:
        """Append one received batch; `tensors` maps column name -> [B, *shape] float32."""
        if not 0 <= epoch <= INT32_MAX or not 0 <= step <= INT64_MAX:
            raise RecordError(f"passive party {party_id}: epoch {epoch} / step {step} is out of "
                              f"the logged range (epoch 0..{INT32_MAX}, step 0..{INT64_MAX})")
        # Everything is checked and built before a party's first record fixes its schema.
        batch, shapes = self._batch(party_id, epoch, step, sample_ids, tensors)
        writer = self.parties.get(party_id)
        if writer is None:
            writer = _PartyWriter(party_id, self.root, self.shard_bytes, shapes, batch.schema)
        try:
            writer.write(batch, step)
        except OSError as err:
            self.write_index()
            status = "RESOURCE_EXHAUSTED" if err.errno in NO_SPACE else "INTERNAL"
            kept = f"up to step {writer.last_step}" if writer.last_step is not None else "empty"
            raise RecordError(f"the gradient log at {self.root} cannot grow: "
                              f"{describe_os_error(err)}; it is intact ({kept}) and the sidecar "
                              "refuses records until it has room", status=status) from None
        self.parties[party_id] = writer
        if time.monotonic() - self._index_written > self.index_interval:
            self.write_index()
        return sample_ids.shape[0]

    def last_step(self, party_id: int) -> int | None:
        writer = self.parties.get(party_id)
        return writer.last_step if writer else None

    def counts(self, party_id: int) -> tuple[int, int]:
        """(records, rows) of a party's log."""
        writer = self.parties.get(party_id)
        return (writer.records, writer.rows) if writer else (0, 0)

    def sync(self, party_id: int) -> None:
        """Make every record of a party survive a machine crash (a checkpoint)."""
        writer = self.parties.get(party_id)
        if writer is not None:
            writer.sync()
        self.write_index()

    def rewind(self, party_id: int, step: int) -> None:
        """Cut a party's log back to its records of train steps < `step` (a resumed run)."""
        writer = self.parties.get(party_id)
        if writer is None:
            return
        writer.close()
        kept: list[dict[str, Any]] = []
        cut = False
        for shard in writer.shards:
            path = self.root / shard["file"]
            if cut:
                path.unlink(missing_ok=True)
                continue
            prefix = _prefix(path, before_step=step)
            if _cut(path, prefix) and not prefix.whole:
                cut = True
            if prefix.records:
                kept.append({**shard, "records": prefix.records, "rows": prefix.rows})
                writer.last_step = prefix.last_step
        writer.shards = kept
        if not kept:
            del self.parties[party_id]
        self.write_index()

    def write_index(self) -> None:
        text = write_index_text(GradientLogIndex(run_id=self.run_id, parties={
            str(k): PartyLog(shapes=w.shapes, shards=[Shard(**s) for s in w.shards])
            for k, w in self.parties.items()}))
        try:
            write_atomically(self.root / INDEX, lambda tmp: tmp.write_text(text))
        except OSError as err:  # the index is a convenience: readers also scan the shards
            log.warning("gradient log index not updated: %s", err)
        self._index_written = time.monotonic()

    def close(self) -> None:
        for writer in self.parties.values():
            writer.close()
        self.write_index()
        self._lock.close()


@dataclass(frozen=True)
class LoggedBatch:
    """One received batch as read back: column name -> float32 [B, d] (flattened)."""

    party_id: int
    epoch: int
    step: int
    sample_ids: np.ndarray
    tensors: dict[str, np.ndarray]
    shard: Path | None = None  # the file it was read from (None: several, e.g. a group's batch)


class GradientLog:
    """Reads a gradient log in streaming batches; memory is one record batch at a time.

    Read-only: a torn or damaged shard is read up to its last complete record, a record holding
    NaN or Inf is left out, and each is warned of once (`warnings`) naming the shard; nothing in
    `root` is written, cut or removed. An unreadable (or missing) index.json is read around: the
    shards carry everything the analysis needs, and `run_id` is then "" (the caller knows it
    from the run directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.warnings: list[str] = []
        self.read = 0  # records yielded so far, by every read of the log
        self.last_step: int | None = None  # the largest step yielded so far
        self.unread: dict[Path, str] = {}  # shard -> why it gave no record (missing, damaged)
        index_path = root / INDEX
        has_shards = root.is_dir() and any(root.glob(f"party_*/*{_SUFFIX}"))
        if not index_path.exists() and not has_shards:
            raise FileNotFoundError(f"no gradient log at {root} (missing {INDEX})")
        problem = None
        try:
            self.index = read_index(index_path) if index_path.exists() else GradientLogIndex()
        except LogIndexError as err:
            problem = str(err)
        except OSError as err:
            problem = f"cannot read {index_path}: {err.strerror or err}"
        if not index_path.exists():
            problem = f"no {index_path}"
        if problem is not None:
            if not has_shards:
                raise LogFormatError(f"{problem}, and {root} holds no shard to read instead")
            self.index = GradientLogIndex()
            self._warn(f"{problem}; the gradient log is read from its shards instead (the index "
                       "only lists them; it is left as it is)")

    @property
    def run_id(self) -> str:
        return self.index.run_id

    def parties(self) -> list[int]:
        on_disk = {_party_of(p) for p in self.root.glob("party_*") if p.is_dir()}
        return sorted(on_disk | {int(k) for k in self.index.parties})

    def shapes(self, party_id: int) -> dict[str, list[int]]:
        entry = self.index.parties.get(str(party_id))
        return dict(entry.shapes) if entry else {}

    def _shards(self, party_id: int) -> list[Path]:
        # Shards written after the last index update are found on disk, in order.
        return sorted((self.root / f"party_{party_id}").glob(f"shard-*{_SUFFIX}"))

    def batches(self, party_id: int) -> Iterator[LoggedBatch]:
        """A party's records in shard order; LogFormatError naming both shards for a step read
        twice (a shard copied under another name: the log is inconsistent)."""
        self._warn_missing(party_id)
        seen: set[int] = set()  # the party's steps so far: ~60 bytes a step
        shards = self._shards(party_id)
        for shard in shards:
            found = self.read
            for batch in self._read_shard(party_id, shard):
                if batch.step in seen:
                    raise LogFormatError(_logged_twice(party_id, batch.step, shards, shard))
                seen.add(batch.step)
                self.read += 1
                self.last_step = max(batch.step, self.last_step if self.last_step is not None else -1)
                yield batch
            if found == self.read:
                self.unread.setdefault(shard, "no complete record with finite gradients")

    def _warn(self, message: str) -> None:
        """Each warning once, however often the log is read (a party alone and in a group)."""
        if message not in self.warnings:
            log.warning(message)
            self.warnings.append(message)

    def _warn_missing(self, party_id: int) -> None:
        """A warning for each shard the index lists that is not on disk (deleted or moved)."""
        entry = self.index.parties.get(str(party_id))
        for shard in entry.shards if entry else []:
            if not (self.root / shard.file).exists():
                self.unread[self.root / shard.file] = f"listed by {INDEX} but missing"
                self._warn(f"{self.root / shard.file}: listed by {INDEX} ({shard.records} record(s)) "
                           "but missing; analysing the shards that are there")

    def _read_shard(self, party_id: int, shard: Path) -> Iterator[LoggedBatch]:
        if shard.exists() and not shard.is_file():
            raise LogFormatError(f"cannot read {shard}: not a regular file (a shard is an Arrow "
                                 "stream file)")
        complete = 0
        non_finite: list[int] = []  # steps
        try:
            with pa.OSFile(str(shard), "rb") as source:
                reader = pa.ipc.open_stream(source)
                while True:
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        return
                    logged = _logged(party_id, batch, shard, complete)
                    complete += 1
                    if all(np.isfinite(t).all() for t in logged.tensors.values()):
                        yield logged
                    else:
                        non_finite.append(logged.step)
        except (pa.ArrowException, OSError) as err:
            # Arrow says "Expected to be able to read N bytes" where the file ends mid-message
            cause = ("a torn tail: the sidecar stopped mid-write?" if "Expected to be able to read"
                     in str(err) else "damaged bytes")
            self._warn(f"{shard}: unreadable after {complete} complete record(s){_unread(shard)} "
                       f"({cause}; Arrow: {err}); analysing the {complete} complete record(s)")
        finally:
            if non_finite:
                steps = ", ".join(map(str, non_finite[:5])) + (", ..." if len(non_finite) > 5 else "")
                self._warn(f"{shard}: {len(non_finite)} record(s) of party {party_id} hold NaN or Inf "
                           f"gradients (step {steps}); the recorder accepts only finite values, so "
                           "the file was damaged after it was written: those batches are left out "
                           "of the analysis")


def _logged_twice(party_id: int, step: int, shards: list[Path], shard: Path) -> str:
    """The refusal of `step` met again in `shard`, naming the shard that held it first."""
    first = next(s for s in shards[:shards.index(shard) + 1] if _holds_step(s, step))
    where = f"twice in {shard}" if first == shard else f"twice: in {first} and in {shard}"
    return (f"step {step} of party {party_id} is logged {where}; a party's log holds each train "
            "step once, so the log is inconsistent (a shard copied or saved under another name?): "
            "move the copy out of the log to analyse it")


def _holds_step(shard: Path, step: int) -> bool:
    """Whether `shard` has a record of `step` (read only to name a step logged twice)."""
    with contextlib.suppress(pa.ArrowException, OSError), pa.OSFile(str(shard), "rb") as source:
        for batch in pa.ipc.open_stream(source):
            if batch.num_rows and batch.column("step")[0].as_py() == step:
                return True
    return False


def _unread(shard: Path) -> str:
    """", N byte(s) left unread" after a shard's complete records ("" when that cannot be told)."""
    try:
        return f", {shard.stat().st_size - _prefix(shard).end} byte(s) left unread"
    except (OSError, pa.ArrowException, IndexError):
        return ""


def _party_of(directory: Path) -> int:
    """The party id of a log's party_<k> folder; LogFormatError for another name."""
    suffix = directory.name.split("_", 1)[1]
    if not (suffix.isascii() and suffix.isdigit()):
        raise LogFormatError(f"{directory}: a gradient log's folders are party_<k> with k a whole "
                             f"number, not {directory.name!r}")
    return int(suffix)


def _logged(party_id: int, batch: pa.RecordBatch, shard: Path, index: int) -> LoggedBatch:
    """Record `index` of `shard` as a LoggedBatch; LogFormatError naming the shard when it is not
    a gradient record (its schema damaged, or another file)."""
    try:
        columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        tensors = {}
        for name, column in columns.items():
            if name in ("sample_id", "epoch", "step"):
                continue
            width = column.type.list_size
            tensors[name] = column.values.to_numpy(zero_copy_only=False).reshape(-1, width)
        return LoggedBatch(party_id, int(columns["epoch"][0].as_py()),
                           int(columns["step"][0].as_py()), columns["sample_id"].to_numpy(), tensors,
                           shard)
    except (KeyError, AttributeError, IndexError, ValueError, TypeError, pa.ArrowException) as err:
        raise LogFormatError(f"{shard}: record {index} is not a gradient record (sample_id, epoch, "
                             f"step and fixed-width float32 columns): {type(err).__name__}: {err}; "
                             "the shard is damaged") from None
