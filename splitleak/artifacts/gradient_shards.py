"""attacker/gradients/party_<k>/shard-<n>.arrows: a party's gradient log shards, walked record
by record (their complete prefix, what a checkpoint's record count needs of them)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

SHARD_SUFFIX = ".arrows"  # Arrow IPC streaming format
_CONTINUATION = 0xFFFFFFFF  # before each message's metadata length (Arrow IPC since 0.15)
_SCHEMA, _RECORD_BATCH = 1, 3  # MessageHeader's union types


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
    short ends the count), and the shard the count ends in. A shard that is whole and ends
    before `step` is counted from its messages' headers, its records' bodies skipped (but its
    last's); only the shard the count ends in is walked record by record."""
    count, last = 0, None
    for shard in shards(folder):
        try:
            whole = _whole_before(shard, step)
            if whole is None:
                prefix = shard_prefix(shard, before_step=step)
        except OSError:  # e.g. removed meanwhile by a sidecar cutting its log back
            break
        if whole is not None:
            count, last = count + whole, shard
            continue
        count, last = count + prefix.records, shard
        if not prefix.whole:
            break
    return count, last


def _whole_before(path: Path, step: int) -> int | None:
    """The record count of a shard that is a schema and whole records (closed, or ending at a
    record's end) all of steps < `step`, read from the messages' headers and its last record;
    None for any other shard (torn, cut, holding step `step` or later: walk it instead). The
    headers are read here because pyarrow's message reader reads each body with its header
    (a log can be tens of GB), and its zero-copy memory map would fault (SIGBUS) on a shard
    a resuming sidecar cuts back meanwhile."""
    size = path.stat().st_size
    starts: list[int] = []  # of each record batch message
    with path.open("rb") as f:
        at = 0
        while at < size:
            head = f.read(8)
            if len(head) < 8:
                return None
            continuation, length = struct.unpack("<Ii", head)
            if continuation != _CONTINUATION or length < 0:
                return None
            if length == 0:  # end of stream
                if at + 8 != size:
                    return None
                break
            kind, body = _header(f.read(length))
            at_next = at + 8 + length + body
            if kind is None or body < 0 or at_next > size or kind != (_SCHEMA if at == 0 else _RECORD_BATCH):
                return None
            starts.append(at)
            at = f.seek(at_next)
        if len(starts) < 2:
            return None if not starts else 0
        try:  # cut meanwhile (a sidecar rewinding): walk it instead
            f.seek(0)
            schema = pa.ipc.read_schema(pa.ipc.read_message(f))
            f.seek(starts[-1])
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(f), schema)
        except pa.ArrowInvalid:
            return None
    if not batch.num_rows or int(batch.column(2)[0].as_py()) >= step:
        return None
    return len(starts) - 1


def _header(metadata: bytes) -> tuple[int | None, int]:
    """A message's header type and body length, from its flatbuffer (None: unreadable)."""
    try:
        table = struct.unpack_from("<I", metadata, 0)[0]
        vtable = table - struct.unpack_from("<i", metadata, table)[0]
        vtable_size = struct.unpack_from("<H", metadata, vtable)[0]

        def field(slot: int, fmt: str) -> int:
            entry = 4 + 2 * slot  # after the vtable's own size and the table's
            offset = struct.unpack_from("<H", metadata, vtable + entry)[0] if entry < vtable_size else 0
            return struct.unpack_from(fmt, metadata, table + offset)[0] if offset else 0

        return field(1, "<B"), field(3, "<q")  # header_type, bodyLength
    except struct.error:
        return None, 0
