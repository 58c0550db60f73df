"""UCI wine (scikit-learn's bundled copy): 13 numeric fields, 3 cultivars as classes 0..2."""

from __future__ import annotations

import numpy as np

from splitleak.datasets.base import DATASETS, Dataset, FeatureSlice, Schema
from splitleak.datasets.tabular import numeric_table_slice


@DATASETS.register("wine")
class Wine(Dataset):
    def schema(self) -> Schema:
        bunch = load_wine()
        return Schema(
            numeric_names=tuple(bunch.feature_names),
            categorical_names=(),
            cardinalities=(),
            num_classes=3,
            num_rows=len(bunch.data),
        )

    def features(self, columns: tuple[int, int]) -> FeatureSlice:
        return numeric_table_slice(self.schema(), columns, load_wine().data)

    def labels(self) -> np.ndarray:
        return load_wine().target.astype(np.int64)


def load_wine():  # noqa: ANN201 - scikit-learn's bundled copy, imported when first read
    from sklearn import datasets

    return datasets.load_wine()
