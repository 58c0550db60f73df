"""Checks of the shared parts of a config against the dataset, before any process starts."""

from __future__ import annotations

from pydantic import ValidationError

from splitleak.config import ConfigError, ExperimentConfig
from splitleak.datasets import DATASETS, DatasetError, Schema
from splitleak.partition import label_party_columns, passive_columns
from splitleak.registry import UnknownPluginError


def check_core(cfg: ExperimentConfig) -> Schema:
    """Dataset name and params, column ranges, loss; returns the dataset's schema."""
    try:
        cls = DATASETS.get(cfg.dataset.name)
    except UnknownPluginError as err:
        raise ConfigError(f"dataset.name: {err}") from None
    try:
        params = cls.Params.model_validate(cfg.dataset.params)
    except ValidationError as err:
        problems = "; ".join(f"dataset.params.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in err.errors())
        raise ConfigError(problems) from None
    try:
        schema = cls(params).schema()
    except DatasetError as err:
        raise ConfigError(f"dataset: {err}") from None
    passive_columns(cfg, schema)
    label_party_columns(cfg, schema)
    cfg.loss_for(schema.num_classes)
    return schema
