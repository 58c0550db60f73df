"""attacker/leak.parquet: its rows, written as the analysis makes them, and read back a group at a time."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from splitleak.fileio import naming

LEAK_SCHEMA = pa.schema([
    ("party_id", pa.int32()), ("layer", pa.string()), ("epoch", pa.int32()), ("step", pa.int64()),
    ("attack", pa.string()), ("name", pa.string()), ("side_knowledge", pa.string()),
    ("metric", pa.string()), ("auc_raw", pa.float64()), ("auc_flipped", pa.float64()),
    ("accuracy", pa.float64()), ("n_rows", pa.int64()), ("n_excluded", pa.int64()),
    ("n_pos", pa.int64()), ("skip_reason", pa.string()), ("seed", pa.int64()),
    ("parties", pa.string()), ("draw", pa.int32()), ("skip_kind", pa.string()),
    ("n_correct", pa.int64()), ("n_predicted", pa.int64()), ("n_no_prediction", pa.int64()),
    ("count_error", pa.float64()), ("threshold_accuracy", pa.float64()),
    ("threshold_rule", pa.string()), ("anchor", pa.string()),
])
LEAK_CHUNK_ROWS = 65536  # rows per Arrow batch (and Parquet row group) of leak.parquet
GROUP_PASS_ROWS = 1 << 18  # rows of (parties, layer, attack) groups held by one read-back pass
GROUP_KEY = ("party_id", "parties", "layer", "attack")
_STRINGS = [f.name for f in LEAK_SCHEMA if f.type == pa.string()]
_SEPARATOR = "\x1f"


@dataclass(slots=True, eq=False, kw_only=True)
class LeakRow(Mapping[str, Any]):
    """One row of attacker/leak.parquet, read like a dict (row["step"], row.get("draw")), in
    about a third of a dict's memory (~350 bytes with its floats, a 26-key dict ~940): the
    analysis holds at most LEAK_CHUNK_ROWS of them, the chunk it writes next."""

    party_id: int
    layer: str
    epoch: int
    step: int
    attack: str
    name: str
    side_knowledge: str
    metric: str
    auc_raw: float | None = None
    auc_flipped: float | None = None
    accuracy: float | None = None
    n_rows: int | None = None
    n_excluded: int | None = None
    n_pos: int | None = None
    skip_reason: str | None = None
    seed: int | None = None
    parties: str | None = None
    draw: int | None = None
    skip_kind: str | None = None
    n_correct: int | None = None
    n_predicted: int | None = None
    n_no_prediction: int | None = None
    count_error: float | None = None
    threshold_accuracy: float | None = None
    threshold_rule: str | None = None
    anchor: str | None = None

    def __getitem__(self, key: str) -> Any:
        if key not in _LEAK_COLUMNS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(LEAK_SCHEMA.names)

    def __len__(self) -> int:
        return len(_LEAK_COLUMNS)

    def __repr__(self) -> str:
        return f"LeakRow({dict(self)!r})"


_LEAK_COLUMNS = frozenset(LEAK_SCHEMA.names)


class LeakWriter:
    """leak.parquet written as the rows come, one Arrow batch of LEAK_CHUNK_ROWS rows at a time
    (the same batches as the whole list cut in chunks): never more than a chunk held."""

    def __init__(self, path: Path) -> None:
        self._path = path
        with naming(path):  # pyarrow's errors name no file (e.g. a full disk)
            self._writer = pq.ParquetWriter(path, LEAK_SCHEMA)
        self._chunk: list[Mapping[str, Any]] = []

    def add(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self._chunk.extend(rows)
        while len(self._chunk) >= LEAK_CHUNK_ROWS:  # the same batches as a row at a time
            full, self._chunk = self._chunk[:LEAK_CHUNK_ROWS], self._chunk[LEAK_CHUNK_ROWS:]
            self._write(full)

    def _flush(self) -> None:
        if self._chunk:
            self._write(self._chunk)
            self._chunk = []

    def _write(self, rows: list[Mapping[str, Any]]) -> None:
        with naming(self._path):
            self._writer.write_batch(_batch(rows))

    def close(self) -> None:
        self._flush()
        with naming(self._path):
            self._writer.close()

    def __enter__(self) -> LeakWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


_ROW_VALUES = operator.attrgetter(*LEAK_SCHEMA.names)


def _batch(rows: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
    """The rows as one Arrow batch, what RecordBatch.from_pylist makes of them (a key a row lacks
    is null), a column at a time from each LeakRow's slots: from_pylist asked each row for each
    of its 26 keys twice (`in`, then `[]`), a third of the analysis's own time with J workers."""
    if all(type(row) is LeakRow for row in rows):
        values = [_ROW_VALUES(row) for row in rows]
    else:
        values = [tuple(row.get(name) for name in LEAK_SCHEMA.names) for row in rows]
    columns = zip(*values, strict=True)
    return pa.RecordBatch.from_arrays([pa.array(list(column), type=field.type)
                                       for column, field in zip(columns, LEAK_SCHEMA, strict=True)],
                                      schema=LEAK_SCHEMA)


Batches = Callable[[list[str]], Iterator[pa.RecordBatch]]  # leak rows' chosen columns, in order


def parquet_batches(path: Path) -> Batches:
    """A leak.parquet's rows, a row group (LEAK_CHUNK_ROWS rows) at a time, its strings as
    dictionaries (4 bytes a row). Not iter_batches: its peak grew with the file (~1 byte each)."""
    def read(columns: list[str]) -> Iterator[pa.RecordBatch]:
        with pq.ParquetFile(path, read_dictionary=[c for c in columns if c in _STRINGS]) as found:
            for group in range(found.num_row_groups):
                yield from found.read_row_group(group, columns=columns).to_batches()
    return read


def row_batches(rows: Sequence[Mapping[str, Any]]) -> Batches:
    """Rows held as dicts (or LeakRows) as Arrow batches; a column a row lacks is null."""
    table = pa.Table.from_pylist(list(rows), schema=LEAK_SCHEMA)
    return lambda columns: iter(table.select(columns).to_batches(max_chunksize=LEAK_CHUNK_ROWS))


@dataclass(frozen=True)
class LeakGroup:
    """One (parties, layer, attack)'s rows in file order, with `row`: each one's index in the file."""

    parties: str  # "1", or "1+2" for a colluding group (old rows without parties: party_id)
    layer: str
    attack: str
    rows: pa.Table


def leak_groups(batches: Batches, columns: list[str]) -> Iterator[LeakGroup]:
    """Every (parties, layer, attack)'s rows with `columns`, read back in passes over the rows
    that each keep a few groups, at most GROUP_PASS_ROWS rows unless one group alone has more:
    memory bounded by a pass (or the largest group: its steps times its draws), not the run."""
    sizes = _group_sizes(batches)
    for chosen in _passes(sizes, GROUP_PASS_ROWS):
        yield from _read_groups(batches, columns, chosen)


def attackers(batch: pa.RecordBatch) -> pa.Array:
    """Each row's attacker as a string: its parties ("1", "1+2"), or its party_id where it names
    none (rows written before leak.parquet had `parties`)."""
    party = pc.cast(batch["party_id"], pa.string())
    if "parties" not in batch.schema.names:
        return party
    parties = pc.cast(batch["parties"], pa.string())
    return pc.if_else(pc.fill_null(pc.not_equal(parties, ""), False), parties, party)


def _keys(batch: pa.RecordBatch) -> pa.Array:
    """Each row's group as one string: its attacker, layer and attack."""
    return pc.binary_join_element_wise(attackers(batch), pc.cast(batch["layer"], pa.string()),
                                       pc.cast(batch["attack"], pa.string()), _SEPARATOR)


def _group_sizes(batches: Batches) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for batch in batches(list(GROUP_KEY)):
        for found in pc.value_counts(_keys(batch)).to_pylist():
            sizes[found["values"]] = sizes.get(found["values"], 0) + found["counts"]
    return sizes


def _passes(sizes: dict[str, int], pass_rows: int) -> Iterator[list[str]]:
    chosen: list[str] = []
    held = 0
    for key, size in sizes.items():
        if chosen and held + size > pass_rows:
            yield chosen
            chosen, held = [], 0
        chosen.append(key)
        held += size
    if chosen:
        yield chosen


def _read_groups(batches: Batches, columns: list[str], chosen: list[str]) -> Iterator[LeakGroup]:
    parts: dict[str, list[pa.RecordBatch]] = {key: [] for key in chosen}
    wanted, first = pa.array(chosen), 0
    for batch in batches(list(dict.fromkeys([*GROUP_KEY, *columns]))):
        for key, rows in _split(batch, columns, wanted, first):
            parts[key].append(rows)
        first += batch.num_rows
    for key in chosen:
        parties, layer, attack = key.split(_SEPARATOR)
        yield LeakGroup(parties, layer, attack, pa.Table.from_batches(parts.pop(key)))


def _split(batch: pa.RecordBatch, columns: list[str], wanted: pa.Array,
           first: int) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batch's rows of the `wanted` groups, a group at a time, each with its row in the file
    (the batch's first is `first`)."""
    keys = _keys(batch)
    picked = np.flatnonzero(pc.is_in(keys, value_set=wanted).to_numpy(zero_copy_only=False))
    if not picked.size:
        return
    kept = batch.select(columns).take(picked).append_column("row", pa.array(first + picked))
    codes = pc.dictionary_encode(keys.take(picked))
    groups = codes.indices.to_numpy()
    ends = np.cumsum(np.bincount(groups, minlength=len(codes.dictionary)))[:-1]
    order = np.split(np.argsort(groups, kind="stable"), ends)
    yield from zip(codes.dictionary.to_pylist(), (kept.take(rows) for rows in order), strict=True)
