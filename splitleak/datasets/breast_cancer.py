"""Wisconsin breast cancer (scikit-learn's bundled copy): 30 numeric fields, 1 = malignant."""

from __future__ import annotations

import numpy as np

from splitleak.datasets.base import DATASETS, Dataset, FeatureSlice, Schema
from splitleak.datasets.tabular import numeric_table_slice


@DATASETS.register("breast_cancer")
class BreastCancer(Dataset):
    """scikit-learn codes malignant as 0; here the positive class 1 is malignant (212 of 569)."""

    def schema(self) -> Schema:
        bunch = load_breast_cancer()
        return Schema(
            numeric_names=tuple(bunch.feature_names),
            categorical_names=(),
            cardinalities=(),
            num_classes=2,
            num_rows=len(bunch.data),
        )

    def features(self, columns: tuple[int, int]) -> FeatureSlice:
        return numeric_table_slice(self.schema(), columns, load_breast_cancer().data)

    def labels(self) -> np.ndarray:
        return (load_breast_cancer().target == 0).astype(np.int64)


def load_breast_cancer():  # noqa: ANN201 - scikit-learn's bundled copy, imported when first read
    from sklearn import datasets

    return datasets.load_breast_cancer()
