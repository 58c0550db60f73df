"""Categorical encodings: stable hash buckets for open vocabularies, sorted file vocabularies."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


def fnv1a64(values: pa.Array) -> np.ndarray:
    """64-bit FNV-1a of each string's UTF-8 bytes (uint64): stable across runs and machines.

    Vectorised over rows, one pass per byte position, so cost is rows x longest string.
    """
    values = values.fill_null("")
    offset_type = np.int64 if pa.types.is_large_string(values.type) else np.int32
    offsets = np.frombuffer(values.buffers()[1], dtype=offset_type)
    offsets = offsets[values.offset : values.offset + len(values) + 1].astype(np.int64)
    data_buffer = values.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else None
    starts, lengths = offsets[:-1], np.diff(offsets)
    hashes = np.full(len(values), FNV_OFFSET, dtype=np.uint64)
    for position in range(int(lengths.max(initial=0))):
        live = lengths > position
        assert data is not None  # some string is longer than `position`
        byte = data[np.where(live, starts + position, 0)].astype(np.uint64)
        hashes = np.where(live, (hashes ^ byte) * FNV_PRIME, hashes)
    return hashes


def hash_buckets(values: pa.Array, vocab_size: int) -> np.ndarray:
    """int64 bucket per string: "" (missing) -> 0, anything else -> 1 + fnv1a64 % (vocab_size-1)."""
    buckets = np.uint64(1) + fnv1a64(values) % np.uint64(vocab_size - 1)
    present = pc.utf8_length(values.fill_null("")).to_numpy(zero_copy_only=False) > 0
    return np.where(present, buckets, np.uint64(0)).astype(np.int64)


def mix64(keys: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a stable, well-spread uint64 hash of integer keys."""
    z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def vocabulary_codes(values: pa.Array, missing: frozenset[str]) -> tuple[np.ndarray, int]:
    """Code each string by its rank in the sorted distinct values of the file (from 1).

    Values in `missing` get 0. Returns (int64 codes, cardinality = distinct values + 1).
    Every party reading the same file derives the same vocabulary.
    """
    vocabulary = sorted(set(pc.unique(values).to_pylist()) - missing)
    index = pc.index_in(values, value_set=pa.array(vocabulary, type=values.type))
    codes = index.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) + 1
    return codes, len(vocabulary) + 1
