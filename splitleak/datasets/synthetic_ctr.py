"""A seeded Criteo-like CTR set: 13 heavy-tailed counts, 26 hashed categories, a hidden logit."""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import numpy as np
from pydantic import Field

from splitleak.datasets.base import DATASETS, Dataset, DatasetParams, FeatureSlice, Schema
from splitleak.datasets.encoding import mix64
from splitleak.datasets.tabular import check_columns, field_ranges, make_slice

CHUNK_ROWS = 65_536  # rows are generated in chunks, each seeded by (seed, stream, chunk, field)
NUMERIC_STREAM, CATEGORICAL_STREAM, LABEL_STREAM, MODEL_STREAM = range(4)


class Count(NamedTuple):
    """floor(exp(mu + sigma * z)), missing -> 0, then log1p; `weight` per std on the logit."""

    mu: float
    sigma: float
    missing: float
    weight: float = 0.0


class Category(NamedTuple):
    """Zipf-like ids over `values` raw values; `effect` = std of a raw value's logit effect."""

    values: int
    missing: float
    effect: float = 0.0


NUMERIC = (  # missing rates after Criteo's
    Count(0.5, 1.5, 0.45), Count(2.0, 2.0, 0.0, 0.4), Count(2.5, 1.5, 0.21),
    Count(1.5, 1.0, 0.22), Count(8.0, 2.0, 0.03, 0.35), Count(4.0, 2.0, 0.22),
    Count(2.0, 1.5, 0.04, -0.35), Count(2.5, 1.0, 0.0, 0.3), Count(4.0, 1.5, 0.04),
    Count(0.3, 0.7, 0.45), Count(1.0, 1.0, 0.04, 0.3), Count(0.3, 1.5, 0.76),
    Count(1.5, 1.2, 0.22),
)  # fmt: skip
CATEGORICAL = (
    Category(1_000, 0.0), Category(500, 0.0, 0.5), Category(500_000, 0.03),
    Category(30, 0.0, 0.5), Category(300, 0.0), Category(10, 0.12, 0.4),
    Category(10_000, 0.0), Category(500, 0.0), Category(3, 0.0, 0.3),
    Category(50_000, 0.0), Category(5_000, 0.0), Category(300_000, 0.03),
    Category(3_000, 0.0), Category(25, 0.0, 0.5), Category(10_000, 0.0),
    Category(200_000, 0.03), Category(10, 0.0, 0.4), Category(5_000, 0.0),
    Category(2_000, 0.44), Category(4, 0.44, 0.3), Category(400_000, 0.03),
    Category(100, 0.0), Category(15, 0.0, 0.4), Category(50_000, 0.0),
    Category(100, 0.44), Category(50_000, 0.44),
)  # fmt: skip
INTERACTIONS = ((3, 13, 0.5), (5, 16, 0.5))  # (field a, field b, effect std) over raw value pairs


class SyntheticCtrParams(DatasetParams):
    rows: int = Field(100_000, ge=1, le=50_000_000)
    positive_rate: float = Field(0.25, gt=0.0, lt=1.0)
    vocab_size: int = Field(1000, ge=2, le=2**31 - 1)  # hashed buckets per categorical field
    seed: int = Field(0, ge=0)
    signal: float = Field(1.0, ge=0.0, le=10.0)  # scales the hidden logit; 0 = labels are noise


def put_rows(out: np.ndarray, start: int, columns: np.ndarray) -> None:
    """out[start:] = columns.T as far as out reaches, in tiles (3x faster than one transpose)."""
    rows = min(columns.shape[1], len(out) - start)
    for tile in range(0, rows, 8192):
        end = min(tile + 8192, rows)
        out[start + tile : start + end] = columns[:, tile:end].T


def sigmoid(logit: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * logit))


@DATASETS.register("synthetic_ctr")
class SyntheticCtr(Dataset):
    """I1..I13 (log1p counts) and C1..C26 (hash buckets, 0 = missing), label 1 = click.

    Every (chunk, field) has its own random stream, so any column range is generated
    chunk by chunk without the others, and `labels()` regenerates just the fields the
    hidden model reads. The model's intercept is solved on chunk 0 so that the expected
    positive rate is `positive_rate`.
    """

    Params = SyntheticCtrParams
    params: SyntheticCtrParams

    def schema(self) -> Schema:
        return Schema(
            numeric_names=tuple(f"I{i}" for i in range(1, len(NUMERIC) + 1)),
            categorical_names=tuple(f"C{i}" for i in range(1, len(CATEGORICAL) + 1)),
            cardinalities=(self.params.vocab_size,) * len(CATEGORICAL),
            num_classes=2,
            num_rows=self.params.rows,
        )

    def features(self, columns: tuple[int, int]) -> FeatureSlice:
        schema = self.schema()
        columns = check_columns(schema, columns)
        numeric_fields, categorical_fields = field_ranges(schema, columns)
        numeric = np.empty((self.params.rows, len(numeric_fields)), dtype=np.float32)
        categorical = np.empty((self.params.rows, len(categorical_fields)), dtype=np.int64)
        for chunk, start, _ in self._chunks():
            counts = [self._count(chunk, field) for field in numeric_fields]
            put_rows(numeric, start, np.array(counts, dtype=np.float32).reshape(-1, CHUNK_ROWS))
            buckets = [self._bucket(f, self._raw_category(chunk, f)) for f in categorical_fields]
            put_rows(categorical, start, np.array(buckets, dtype=np.int64).reshape(-1, CHUNK_ROWS))
        return make_slice(schema, columns, numeric, categorical)

    def labels(self) -> np.ndarray:
        labels = np.empty(self.params.rows, dtype=np.int64)
        for chunk, start, stop in self._chunks():
            click = sigmoid(self._intercept + self._hidden_logit(chunk))
            uniform = self._rng(LABEL_STREAM, chunk).random(CHUNK_ROWS)
            labels[start:stop] = (uniform < click)[: stop - start]
        return labels

    def _chunks(self) -> list[tuple[int, int, int]]:
        """(chunk index, first row, end row); the last chunk is generated whole, then cut."""
        starts = range(0, self.params.rows, CHUNK_ROWS)
        return [(i, s, min(s + CHUNK_ROWS, self.params.rows)) for i, s in enumerate(starts)]

    def _rng(self, stream: int, chunk: int, field: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.params.seed, stream, chunk, field])

    def _count(self, chunk: int, field: int) -> np.ndarray:
        """Column I{field+1} of a whole chunk (float32 log1p counts)."""
        spec = NUMERIC[field]
        rng = self._rng(NUMERIC_STREAM, chunk, field)
        counts = np.floor(np.exp(spec.mu + spec.sigma * rng.standard_normal(CHUNK_ROWS)))
        if spec.missing:
            counts[rng.random(CHUNK_ROWS, dtype=np.float32) < spec.missing] = 0.0  # filled as 0
        return np.log1p(counts.astype(np.float32))

    def _raw_category(self, chunk: int, field: int) -> np.ndarray:
        """Raw value ids of C{field+1} for a whole chunk: P(id = k) ~ 1/(k+1); -1 = missing."""
        spec = CATEGORICAL[field]
        rng = self._rng(CATEGORICAL_STREAM, chunk, field)
        uniform = rng.random(CHUNK_ROWS)
        raw = np.exp(uniform * np.log(spec.values + 1)).astype(np.int64) - 1
        raw = np.minimum(raw, spec.values - 1)
        if spec.missing:
            raw[rng.random(CHUNK_ROWS, dtype=np.float32) < spec.missing] = -1
        return raw

    def _bucket(self, field: int, raw: np.ndarray) -> np.ndarray:
        """What a party sees: missing -> 0, raw id -> 1 + hash mapped onto [0, vocab_size - 1)."""
        hashes = mix64(raw.astype(np.uint64) ^ np.uint64((field + 1) << 40)) >> np.uint64(32)
        # multiply-shift maps a 32-bit hash onto [0, vocab_size - 1) without a slow modulo
        buckets = (hashes * np.uint64(self.params.vocab_size - 1)) >> np.uint64(32)
        return np.where(raw < 0, 0, buckets.astype(np.int64) + 1)

    @cached_property
    def _effects(self) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
        """Per raw value effect tables (last entry: missing -> 0) and pairwise tables."""
        rng = self._rng(MODEL_STREAM, 0)
        effects = {
            field: np.append(spec.effect * rng.standard_normal(spec.values), 0.0)
            for field, spec in enumerate(CATEGORICAL)
            if spec.effect
        }
        pairs = [
            std * rng.standard_normal((CATEGORICAL[a].values + 1, CATEGORICAL[b].values + 1))
            for a, b, std in INTERACTIONS
        ]
        return effects, pairs

    def _hidden_logit(self, chunk: int) -> np.ndarray:
        """The label model's logit for a whole chunk, minus the intercept."""
        effects, pairs = self._effects
        logit = np.zeros(CHUNK_ROWS)
        for field, spec in enumerate(NUMERIC):
            if spec.weight:
                z = (self._count(chunk, field).astype(np.float64) - spec.mu) / spec.sigma
                logit += spec.weight * np.clip(z, -3.0, 3.0)
        read = {*effects, *(field for a, b, _ in INTERACTIONS for field in (a, b))}
        raw = {field: self._raw_category(chunk, field) for field in read}
        for field, table in effects.items():
            logit += table[raw[field]]  # index -1 (missing) is the trailing 0
        for (a, b, _), table in zip(INTERACTIONS, pairs, strict=True):
            logit += table[raw[a], raw[b]]
        return self.params.signal * logit

    @cached_property
    def _intercept(self) -> float:
        """Solve mean(sigmoid(b + logit)) = positive_rate on chunk 0 by bisection."""
        logit = self._hidden_logit(0)
        low, high = -40.0, 40.0
        for _ in range(60):
            middle = 0.5 * (low + high)
            if sigmoid(middle + logit).mean() < self.params.positive_rate:
                low = middle
            else:
                high = middle
        return 0.5 * (low + high)
