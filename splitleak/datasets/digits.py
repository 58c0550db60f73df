"""Bundled 8x8 handwritten digits as [n, 1, 8, 8] images: 10 classes or one-vs-rest."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from pydantic import Field

from splitleak.datasets.base import DATASETS, Dataset, DatasetParams, FeatureSlice, Schema
from splitleak.datasets.tabular import image_slice


def digit_images() -> np.ndarray:
    """float32 [1797, 1, 8, 8], pixel intensities 0..16 scaled to [0, 1]."""
    return (load_digits().images[:, None, :, :] / 16.0).astype(np.float32)


@DATASETS.register("digits")
class Digits(Dataset):
    """Columns are the 8 pixel columns of the image; a range is a vertical strip."""

    def schema(self) -> Schema:
        return Schema(
            numeric_names=(),
            categorical_names=(),
            cardinalities=(),
            num_classes=10,
            num_rows=len(load_digits().images),
            image_shape=(1, 8, 8),
        )

    def features(self, columns: tuple[int, int]) -> FeatureSlice:
        return image_slice(self.schema(), columns, digit_images())

    def labels(self) -> np.ndarray:
        return load_digits().target.astype(np.int64)


class DigitsBinaryParams(DatasetParams):
    positive_digit: int = Field(0, ge=0, le=9)


@DATASETS.register("digits_binary")
class DigitsBinary(Digits):
    """The same images; label 1 iff the image shows `positive_digit` (about 10% positives)."""

    Params = DigitsBinaryParams
    params: DigitsBinaryParams

    def schema(self) -> Schema:
        return replace(super().schema(), num_classes=2)

    def labels(self) -> np.ndarray:
        return (load_digits().target == self.params.positive_digit).astype(np.int64)


def load_digits():  # noqa: ANN201 - scikit-learn's bundled copy, imported when first read
    from sklearn import datasets

    return datasets.load_digits()
