"""What every dataset plug-in provides: features by column range, labels apart."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import AfterValidator, ValidationError

from splitleak.registry import Registry
from splitleak.settings import Settings


class DatasetError(ValueError):
    """A dataset file is missing or malformed, or its parameters are wrong."""


def _named(path: str) -> str:
    if not path.strip():
        raise ValueError("it is empty; give the path of the data file")
    return path


DataPath = Annotated[str, AfterValidator(_named)]  # a data file's path, as the user gave it


class DatasetParams(Settings):
    """Base of every dataset's parameter model (validated from the config's `dataset.params`)."""


@dataclass(frozen=True)
class Schema:
    """The feature columns of a dataset, in column-index order.

    Tabular data: columns are fields; numeric fields come first (indices 0..p-1),
    categorical fields after (p..p+c-1). Image data (`image_shape` set): columns are
    the image's pixel columns (the width axis), so a range [a, b) is a vertical strip.
    """

    numeric_names: tuple[str, ...]
    categorical_names: tuple[str, ...]
    cardinalities: tuple[int, ...]  # one per categorical field (ids are in [0, cardinality))
    num_classes: int
    num_rows: int
    image_shape: tuple[int, int, int] | None = None  # (channels, height, width)

    @property
    def num_columns(self) -> int:
        if self.image_shape is not None:
            return self.image_shape[2]
        return len(self.numeric_names) + len(self.categorical_names)


@dataclass(frozen=True)
class FeatureSlice:
    """One party's columns for every row; row i is sample id i. Never holds labels."""

    columns: tuple[int, int]  # half-open [start, stop) in Schema column indices
    numeric: np.ndarray  # float32 [n, p_k]; for images float32 [n, C, H, stop-start]
    categorical: np.ndarray  # int64 [n, c_k] (shape [n, 0] when none)
    cardinalities: tuple[int, ...]  # of the categorical columns in this slice
    numeric_names: tuple[str, ...] = ()
    categorical_names: tuple[str, ...] = ()

    @property
    def num_rows(self) -> int:
        return int(self.numeric.shape[0])


class Dataset(ABC):
    """A dataset plug-in. Parties ask only for what they may hold.

    `features()` is what a passive party calls: it must not return or keep labels.
    `labels()` is for the label party only.
    """

    Params: ClassVar[type[DatasetParams]] = DatasetParams

    def __init__(self, params: DatasetParams) -> None:
        self.params = params

    @abstractmethod
    def schema(self) -> Schema: ...

    def layout(self) -> Schema:
        """The schema where its row count is not needed (0 where counting rows costs a pass
        over the data): what the models' shapes depend on."""
        return self.schema()

    @abstractmethod
    def features(self, columns: tuple[int, int]) -> FeatureSlice: ...

    @abstractmethod
    def labels(self) -> np.ndarray:
        """int64 [n], classes 0..num_classes-1 (binary: 1 = positive)."""

    def check_values(self) -> None:
        """Parse every value of the data files, streaming (what `splitleak validate` adds to
        the schema checks); a DatasetError names the file, line and column of the first bad
        one. Nothing to add for data that is generated, bundled, or fully checked already
        while building the schema."""
        return None


DATASETS: Registry[type[Dataset]] = Registry("dataset")


def build_dataset(name: str, params: dict[str, Any]) -> Dataset:
    """The named dataset; DatasetError naming each bad field of `dataset.params`."""
    cls = DATASETS.get(name)
    try:
        return cls(cls.Params.model_validate(params))
    except ValidationError as err:
        from splitleak.config import plugin_param_errors

        raise DatasetError(plugin_param_errors("dataset.params", err)) from None
