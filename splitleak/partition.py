"""Which feature columns each party holds, resolved against the dataset's schema."""

from __future__ import annotations

import numpy as np

from splitleak.config import ConfigError, ExperimentConfig
from splitleak.datasets.base import Schema


def _check_range(field: str, cols: tuple[int, int], schema: Schema) -> tuple[int, int]:
    start, stop = cols
    if stop > schema.num_columns:
        unit = "pixel columns" if schema.image_shape else "columns"
        raise ConfigError(f"{field}: range [{start}, {stop}) is out of bounds; the dataset has "
                          f"{schema.num_columns} {unit} (allowed: 0 <= start < stop <= "
                          f"{schema.num_columns})")
    return int(start), int(stop)


def passive_columns(cfg: ExperimentConfig, schema: Schema) -> dict[int, tuple[int, int]]:
    """Party id (1..N) -> half-open column range."""
    if cfg.features.passive is not None:
        return {k + 1: _check_range(f"features.passive[{k}]", r, schema)
                for k, r in enumerate(cfg.features.passive)}
    ratios = np.asarray(cfg.features.ratios, dtype=float)
    total = schema.num_columns
    if total < len(ratios):
        raise ConfigError(f"features.ratios: {len(ratios)} parties but only {total} columns; each "
                          f"party holds at least one (allowed: at most {total} ratios, with "
                          f"topology.passive_parties = as many)")
    # Largest-remainder rounding with at least one column each.
    exact = ratios / ratios.sum() * total
    counts = np.maximum(np.floor(exact).astype(int), 1)
    while counts.sum() > total:
        counts[np.argmax(counts)] -= 1
    order = np.argsort(-(exact - np.floor(exact)), kind="stable")
    i = 0
    while counts.sum() < total:
        counts[order[i % len(order)]] += 1
        i += 1
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return {k + 1: (int(bounds[k]), int(bounds[k + 1])) for k in range(len(counts))}


def label_party_columns(cfg: ExperimentConfig, schema: Schema) -> tuple[int, int] | None:
    if cfg.features.label_party is None:
        return None
    return _check_range("features.label_party", cfg.features.label_party, schema)
