"""Column ranges over a Schema, and cutting feature slices out of tables and images."""

from __future__ import annotations

import numpy as np

from splitleak.datasets.base import DatasetError, FeatureSlice, Schema


def check_columns(schema: Schema, columns: tuple[int, int]) -> tuple[int, int]:
    """Validate a half-open column range [start, stop) against the schema."""
    try:
        start, stop = (int(index) for index in columns)
    except (TypeError, ValueError):
        raise DatasetError(
            f"columns must be a (start, stop) pair of ints, got {columns!r}"
        ) from None
    if not 0 <= start < stop <= schema.num_columns:
        raise DatasetError(
            f"column range [{start}, {stop}) is empty or outside [0, {schema.num_columns})"
        )
    return start, stop


def field_ranges(schema: Schema, columns: tuple[int, int]) -> tuple[range, range]:
    """Indices of the numeric fields and of the categorical fields (within each kind) in range."""
    start, stop = columns
    p = len(schema.numeric_names)
    return range(start, min(stop, p)), range(max(start, p) - p, max(stop, p) - p)


def make_slice(
    schema: Schema, columns: tuple[int, int], numeric: np.ndarray, categorical: np.ndarray | None
) -> FeatureSlice:
    """A tabular slice from the already-cut columns of the range (categorical None: none)."""
    numeric_fields, categorical_fields = field_ranges(schema, columns)
    if categorical is None:
        categorical = np.zeros((len(numeric), 0), dtype=np.int64)
    return FeatureSlice(
        columns=columns,
        numeric=np.ascontiguousarray(numeric, dtype=np.float32),
        categorical=np.ascontiguousarray(categorical, dtype=np.int64),
        cardinalities=tuple(schema.cardinalities[i] for i in categorical_fields),
        numeric_names=tuple(schema.numeric_names[i] for i in numeric_fields),
        categorical_names=tuple(schema.categorical_names[i] for i in categorical_fields),
    )


def numeric_table_slice(
    schema: Schema, columns: tuple[int, int], table: np.ndarray
) -> FeatureSlice:
    """Slice of an in-memory all-numeric table [n, p]."""
    start, stop = check_columns(schema, columns)
    return make_slice(schema, (start, stop), table[:, start:stop], None)


def image_slice(schema: Schema, columns: tuple[int, int], images: np.ndarray) -> FeatureSlice:
    """Vertical strip [start, stop) of the width axis of images [n, C, H, W]."""
    start, stop = check_columns(schema, columns)
    return FeatureSlice(
        columns=(start, stop),
        numeric=np.ascontiguousarray(images[..., start:stop], dtype=np.float32),
        categorical=np.zeros((len(images), 0), dtype=np.int64),
        cardinalities=(),
    )


def stack_columns(columns: list[np.ndarray], rows: int, dtype: type) -> np.ndarray:
    """[rows, len(columns)] matrix of 1-D columns (also when there are none)."""
    if not columns:
        return np.zeros((rows, 0), dtype=dtype)
    return np.stack(columns, axis=1).astype(dtype, copy=False)
