"""Seeded random images with random labels: the shape of CIFAR at any size, for speed runs.

Nothing can be learnt from them (labels are independent of the pixels): they exist to time a
model family (e.g. ResNet-18 bottoms on a GPU) without a data set on disk."""

from __future__ import annotations

import numpy as np
from pydantic import Field, model_validator

from splitleak.datasets.base import DATASETS, Dataset, DatasetParams, FeatureSlice, Schema
from splitleak.datasets.tabular import check_columns
from splitleak.seeding import rng

# Float32 pixels of every image together (each party draws its strip, then copies it once):
# 16 GiB, 4e9 pixels, is 70 times CIFAR-10's 60,000 images; each bound alone allowed 33 TB.
MAX_PIXELS = 1 << 32


class SyntheticImagesParams(DatasetParams):
    rows: int = Field(60_000, ge=2, le=2_000_000)
    classes: int = Field(10, ge=2, le=1_000)
    channels: int = Field(3, ge=1, le=16)
    height: int = Field(32, ge=1, le=512)
    width: int = Field(32, ge=1, le=512)
    seed: int = Field(0, ge=0, lt=2**63)

    @model_validator(mode="after")
    def _bounded(self) -> SyntheticImagesParams:
        pixels = self.rows * self.channels * self.height * self.width
        if pixels > MAX_PIXELS:
            raise ValueError(
                f"rows × channels × height × width = {self.rows:,} × {self.channels} × "
                f"{self.height} × {self.width} = {pixels:,} float32 pixels take "
                f"{pixels * 4 / 2**30:,.0f} GiB; allowed: at most {MAX_PIXELS:,} (16 GiB), so "
                f"at most {MAX_PIXELS // (self.channels * self.height * self.width):,} rows of "
                "this image size")
        return self


@DATASETS.register("synthetic_images")
class SyntheticImages(Dataset):
    """Columns are pixel columns; a range is a vertical strip (as for cifar10). Pixels are drawn
    per strip from the seed, so a party generates only its own columns."""

    Params = SyntheticImagesParams
    params: SyntheticImagesParams

    def schema(self) -> Schema:
        p = self.params
        return Schema(numeric_names=(), categorical_names=(), cardinalities=(),
                      num_classes=p.classes, num_rows=p.rows,
                      image_shape=(p.channels, p.height, p.width))

    def features(self, columns: tuple[int, int]) -> FeatureSlice:
        p = self.params
        start, stop = check_columns(self.schema(), columns)
        columns_first = np.empty((stop - start, p.rows, p.channels, p.height), dtype=np.float32)
        for c in range(start, stop):
            rng(p.seed, "synthetic_images", "column", c).random(
                (p.rows, p.channels, p.height), dtype=np.float32, out=columns_first[c - start])
        strip = np.ascontiguousarray(columns_first.transpose(1, 2, 3, 0))
        return FeatureSlice(columns=(start, stop), numeric=strip,
                            categorical=np.zeros((p.rows, 0), dtype=np.int64), cardinalities=())

    def labels(self) -> np.ndarray:
        p = self.params
        return rng(p.seed, "synthetic_images", "labels").integers(0, p.classes, p.rows)
