"""The train/test split every party derives from the config, and train-statistics scaling."""

from __future__ import annotations

import numpy as np

from splitleak.datasets.base import DatasetError


def train_test_ids(num_rows: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample ids of the train and test rows (int64, ascending, disjoint, covering 0..n-1)."""
    if num_rows < 2:
        raise DatasetError(f"need at least 2 rows to split into train and test, got {num_rows}")
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"test_fraction must be in (0, 1), got {test_fraction}")
    order = np.random.default_rng(seed).permutation(num_rows)
    num_test = num_test_rows(num_rows, test_fraction)
    return np.sort(order[num_test:]).astype(np.int64), np.sort(order[:num_test]).astype(np.int64)


def num_test_rows(num_rows: int, test_fraction: float) -> int:
    """How many of `num_rows` rows the split tests on: at least one, and one left to train."""
    return min(max(round(num_rows * test_fraction), 1), num_rows - 1)


def num_subset_rows(num_ids: int, fraction: float) -> int:
    """How many of `num_ids` ids a subset of `fraction` keeps: at least 2 (or all there are)."""
    return min(max(2, round(fraction * num_ids)), num_ids)


def subset_ids(ids: np.ndarray, fraction: float, generator: np.random.Generator) -> np.ndarray:
    """A random `fraction` of `ids` without replacement (at least 2 rows), ascending."""
    return np.sort(generator.choice(ids, size=num_subset_rows(ids.size, fraction), replace=False))


def scaling(numeric: np.ndarray, train_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of the train rows as `standardize` uses them: per column for a table, one
    pair over every pixel for images; a std of 0 reads as 1."""
    if numeric.ndim not in (2, 4):
        raise DatasetError(
            f"expected a [n, p] table or [n, C, H, W] images, got shape {numeric.shape}"
        )
    if len(train_ids) == 0:
        raise DatasetError("standardize needs at least one train row")
    train = numeric[train_ids].astype(np.float64)
    axis = 0 if numeric.ndim == 2 else None
    mean, std = train.mean(axis=axis), train.std(axis=axis)
    return mean, np.where(std > 0, std, 1.0)


def standardize(numeric: np.ndarray, train_ids: np.ndarray) -> np.ndarray:
    """Z-score with statistics of the train rows only, so nothing is learned from test rows.

    Tabular [n, p]: one mean/std per column. Images [n, C, H, W]: one mean/std over every
    pixel of the train rows, so a party's strip is scaled like the whole image would be.
    A constant column (std 0) is only centred.
    """
    mean, std = scaling(numeric, train_ids)
    return ((numeric - mean) / std).astype(np.float32)
