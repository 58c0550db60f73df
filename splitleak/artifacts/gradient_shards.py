"""attacker/gradients/party_<k>/shard-<n>.arrows: a party's gradient log shards, walked record
by record (their complete prefix, what a checkpoint's record count needs of them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

SHARD_SUFFIX = ".arrows"  # Arrow IPC streaming format


@dataclass(frozen=True)
class ShardPrefix:
    """The complete records at the start of a shard (before `before_step`, when given)."""

    end: int  # byte offset just after the last of them
    records: int
    rows: int
    first_step: int | None
    last_step: int | None
    schema: pa.Schema | None
    whole: bool  # the shard holds nothing else (no torn tail, no later record)


def shard_prefix(path: Path, before_step: int | None = None) -> ShardPrefix:
    """Walk a shard message by message, stopping at a torn tail or at `before_step` (read, not
    memory-mapped: a sidecar may cut the shard meanwhile)."""
    end = records = rows = 0
    first = last = None
    schema = None
    whole = False
    with pa.OSFile(str(path), "rb") as source:
        reader = pa.ipc.MessageReader.open_stream(source)
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                whole = True
                break
            except (OSError, pa.ArrowInvalid):
                break  # torn: the sidecar stopped in the middle of this message
            if message.type == "schema":
                schema, end = pa.ipc.read_schema(message), source.tell()
                continue
            if schema is None or message.type != "record batch":
                break
            batch = pa.ipc.read_record_batch(message, schema)
            step = int(batch.column(2)[0].as_py()) if batch.num_rows else last
            if before_step is not None and step is not None and step >= before_step:
                break
            end, records, rows = source.tell(), records + 1, rows + batch.num_rows
            first = step if first is None else first
            last = step
    return ShardPrefix(end, records, rows, first, last, schema, whole)


def shards(folder: Path) -> list[Path]:
    """A party's shards, in the order they were written."""
    return sorted(folder.glob(f"shard-*{SHARD_SUFFIX}"))


def records_before(folder: Path, step: int) -> tuple[int, Path | None]:
    """How many records of train steps < `step` a party's log holds without a gap (a shard cut
    short ends the count), and the shard the count ends in."""
    count, last = 0, None
    for shard in shards(folder):
        try:
            prefix = shard_prefix(shard, before_step=step)
        except OSError:  # e.g. removed meanwhile by a sidecar cutting its log back
            break
        count, last = count + prefix.records, shard
        if not prefix.whole:
            break
    return count, last
