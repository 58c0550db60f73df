"""Checks of the shared parts of a config against the dataset, before any process starts."""

from __future__ import annotations

import torch
from pydantic import ValidationError

from splitleak.config import ConfigError, ExperimentConfig, plugin_param_errors
from splitleak.datasets import DATASETS, DatasetError, Schema
from splitleak.models import InputSpec, build_bottom, build_top, input_spec
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
        raise ConfigError(plugin_param_errors("dataset.params", err)) from None
    try:
        schema = cls(params).schema()
    except DatasetError as err:
        raise ConfigError(f"dataset: {err}") from None
    columns = passive_columns(cfg, schema)
    own = label_party_columns(cfg, schema)
    cfg.loss_for(schema.num_classes)
    check_models(cfg, schema, columns, own)
    return schema


def check_models(cfg: ExperimentConfig, schema: Schema, columns: dict[int, tuple[int, int]],
                 own: tuple[int, int] | None) -> None:
    """Build every party's model once on a zero row: shapes that cannot fit fail here."""
    width = cfg.output_width(schema.num_classes)
    try:
        shapes = []
        for cols in columns.values():
            spec = input_spec(schema, cols)
            bottom = build_bottom(cfg.model, spec, width, seed=0)
            with torch.no_grad():
                shapes.append(tuple(bottom(*_zero_row(spec)).shape[1:]))
        build_top(cfg.model, shapes, input_spec(schema, own) if own else None, width, seed=0)
    except (ValueError, RuntimeError) as err:
        raise ConfigError(f"model: {err}") from None


def _zero_row(spec: InputSpec) -> tuple[torch.Tensor, torch.Tensor]:
    if spec.image_shape is not None:
        return torch.zeros(1, *spec.image_shape), torch.zeros(1, 0, dtype=torch.int64)
    return (torch.zeros(1, spec.num_numeric),
            torch.zeros(1, len(spec.cardinalities), dtype=torch.int64))
