"""Dataset plug-ins by name; importing this package registers every built-in loader."""

from splitleak.datasets import (  # noqa: F401  (imported to register)
    adult,
    avazu,
    bank,
    breast_cancer,
    cifar,
    criteo,
    digits,
    mnist,
    spambase,
    synthetic_ctr,
    synthetic_images,
    wine,
)
from splitleak.datasets.base import (
    DATASETS,
    Dataset,
    DatasetError,
    FeatureSlice,
    Schema,
    build_dataset,
    check_against_schema,
)
from splitleak.datasets.split import standardize, subset_ids, train_test_ids

__all__ = [
    "DATASETS",
    "Dataset",
    "DatasetError",
    "FeatureSlice",
    "Schema",
    "build_dataset",
    "check_against_schema",
    "standardize",
    "subset_ids",
    "train_test_ids",
]
