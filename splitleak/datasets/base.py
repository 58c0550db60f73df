"""What every dataset plug-in provides: features by column range, labels apart."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import AfterValidator, ValidationError

from splitleak.provenance import described
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
    # The files a folder named by a data path is read for (None: every file in it): what a
    # checkpoint records and what a party's copy is compared by (splitleak.data_files).
    FOLDER_FILES: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, params: DatasetParams) -> None:
        self.params = params

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every dataset's answers are checked where they are given (`CHECKS`): a plug-in that
        returns the wrong thing, or raises, is a DatasetError naming it (and its package), which
        every role reports in one line, not a failure somewhere downstream."""
        super().__init_subclass__(**kwargs)
        for method, check in CHECKS.items():
            own = cls.__dict__.get(method)
            if own is not None and not hasattr(own, "__checked__"):
                setattr(cls, method, _checked(own, method, check))

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


DATASETS: Registry[type[Dataset]] = Registry("dataset", Dataset)


def origin(dataset: type[Dataset]) -> str:
    """The dataset in words: its registered name, and its entry point and package if installed."""
    from splitleak.provenance import plugin_origin

    names = [n for n in DATASETS.names() if DATASETS.get(n) is dataset]
    return plugin_origin("dataset", names[0] if names else dataset.__qualname__, dataset)


def _checked(method: Callable, name: str, check: Callable[[Any, tuple], str | None]) -> Callable:
    @functools.wraps(method)
    def checked(self: Dataset, *args: Any, **kwargs: Any) -> Any:
        from splitleak.provenance import is_built_in, raised

        try:
            result = method(self, *args, **kwargs)
        except DatasetError:
            raise
        except Exception as err:
            if is_built_in(type(self)):
                raise
            raise DatasetError(f"{origin(type(self))}: {name}() raised "
                               f"{raised(err, type(self))}") from err
        problem = check(result, args)
        if problem:
            raise DatasetError(f"{origin(type(self))}: {name}() returned {problem}")
        return result

    checked.__checked__ = True  # type: ignore[attr-defined]
    return checked


def _schema_problem(schema: Any, args: tuple) -> str | None:
    if not isinstance(schema, Schema):
        return f"{described(schema)}; it must return a splitleak.datasets.Schema"
    if not isinstance(schema.num_classes, int | np.integer) or schema.num_classes < 2:
        return f"a Schema with num_classes = {schema.num_classes!r}; it must be an int ≥ 2"
    if not isinstance(schema.num_rows, int | np.integer) or schema.num_rows < 0:
        return f"a Schema with num_rows = {schema.num_rows!r}; it must be an int ≥ 0"
    return None


def _features_problem(found: Any, args: tuple) -> str | None:
    if not isinstance(found, FeatureSlice):
        return f"{described(found)}; it must return a splitleak.datasets.FeatureSlice"
    numeric, categorical = found.numeric, found.categorical
    if not isinstance(numeric, np.ndarray) or numeric.dtype.kind not in "fiu" \
            or numeric.ndim not in (2, 4):
        return (f"a FeatureSlice whose numeric is {described(numeric)}; it must be a float32 "
                "array [num_rows, numeric columns] (images: [num_rows, C, H, columns])")
    if not isinstance(categorical, np.ndarray) or categorical.dtype.kind not in "iu" \
            or categorical.ndim != 2:
        return (f"a FeatureSlice whose categorical is {described(categorical)}; it must be an int64 "
                "array [num_rows, categorical columns] ([num_rows, 0] when there are none)")
    if numeric.shape[0] != categorical.shape[0]:
        return (f"a FeatureSlice with {numeric.shape[0]} numeric and {categorical.shape[0]} "
                "categorical rows; both hold every row, row i being sample id i")
    if args:
        start, stop = (int(c) for c in args[0])
        width = numeric.shape[-1] if numeric.ndim == 4 else numeric.shape[1] + categorical.shape[1]
        if width != stop - start:
            return (f"{width} column(s) for the range [{start}, {stop}); it must return exactly "
                    f"the {stop - start} asked for")
    return None


def _labels_problem(labels: Any, args: tuple) -> str | None:
    if not isinstance(labels, np.ndarray) or labels.ndim != 1 or labels.dtype.kind not in "iu":
        return (f"{described(labels)}; it must return an int64 array [num_rows] of class ids "
                "0..num_classes-1")
    return None



def _anything(result: Any, args: tuple) -> None:
    return None


CHECKS: dict[str, Callable[[Any, tuple], str | None]] = {
    "__init__": _anything, "check_values": _anything, "schema": _schema_problem,
    "layout": _schema_problem, "features": _features_problem,
    "labels": _labels_problem}


def check_against_schema(dataset: Dataset, schema: Schema, labels: np.ndarray | None = None,
                         features: FeatureSlice | None = None) -> None:
    """DatasetError naming the dataset where its labels or a feature slice disagree with its
    schema: one row per schema row, and class ids in 0..num_classes-1."""
    for what, rows in (("labels()", None if labels is None else len(labels)),
                       ("features()", None if features is None else features.num_rows)):
        if rows is not None and schema.num_rows and rows != schema.num_rows:
            raise DatasetError(f"{origin(type(dataset))}: {what} returned {rows} rows and schema() says "
                               f"num_rows = {schema.num_rows}; row i is sample id i in both")
    if labels is not None and labels.size:
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= schema.num_classes:
            raise DatasetError(f"{origin(type(dataset))}: labels() returned class ids {low}..{high}, and "
                               f"schema() says num_classes = {schema.num_classes}: they must "
                               f"be in 0..{schema.num_classes - 1} (binary: 1 = positive)")


def build_dataset(name: str, params: dict[str, Any]) -> Dataset:
    """The named dataset; DatasetError naming each bad field of `dataset.params`."""
    cls = DATASETS.get(name)
    try:
        return cls(cls.Params.model_validate(params))
    except ValidationError as err:
        from splitleak.config import plugin_param_errors

        raise DatasetError(plugin_param_errors("dataset.params", err)) from None
