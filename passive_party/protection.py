"""The party's input protection ([protection], e.g. Anti-GAN): its train images are replaced once,
before training, by the protected ones; its test images stay real, so the test metric is the
protection's utility cost."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Any

import torch
from pydantic import ValidationError
from torch import nn

from passive_party.bottom_trainer import BottomTrainer
from passive_party.protections import Protection, build_protection
from splitleak.artifacts.paths import RunDir
from splitleak.config import ConfigError, ExperimentConfig, plugin_param_errors
from splitleak.datasets import train_test_ids
from splitleak.datasets.base import Schema
from splitleak.fileio import write_atomically
from splitleak.partition import passive_columns
from splitleak.plugins import PluginGroup
from splitleak.registry import UnknownPluginError
from splitleak.seeding import derive_seed
from splitleak.watchdog import Stuck, stuck_sentence, suspects, watched

log = logging.getLogger("passive_party")


def configured_protection(cfg: ExperimentConfig) -> Protection:
    """The protection [protection] names, built from its params; ConfigError naming the field."""
    try:
        return build_protection(cfg.protection.name, cfg.protection.params)
    except UnknownPluginError as err:
        raise ConfigError(f"protection.name: {err}, none") from None
    except ValidationError as err:
        raise ConfigError(plugin_param_errors("protection.params", err)) from None


def check_protection(cfg: ExperimentConfig, schema: Schema | None = None) -> None:
    """[protection] names a registered protection, with parameters it accepts (for the images
    each of its parties holds, with the dataset's `schema`), for parties that hold images
    through a CNN bottom; ConfigError naming the field."""
    p = cfg.protection
    if p.name == "none":
        if p.parties or p.params:
            raise ConfigError("protection.parties / params are set but protection.name = 'none' "
                              "(e.g. name = 'antigan')")
        return
    protection = configured_protection(cfg)
    if len(set(p.parties)) != len(p.parties):
        raise ConfigError(f"protection.parties = {p.parties} names a party twice")
    if not p.parties:
        raise ConfigError(f"protection.name = '{p.name}' needs protection.parties: the passive "
                          "parties that protect their images")
    if cfg.model.kind != "cnn":
        raise ConfigError(f"protection.name = '{p.name}' needs model.kind = 'cnn': its feature "
                          f"extractor is the party's first conv block (got '{cfg.model.kind}')")
    if schema is None or schema.image_shape is None:
        return
    channels, height, _ = schema.image_shape
    columns = passive_columns(cfg, schema)
    for k in p.parties:
        if k in columns:
            start, stop = columns[k]
            reason = protection.check_images((channels, height, stop - start))
            if reason is not None:
                raise ConfigError(f"protection.params.{reason} (party {k})")


PLUGINS = PluginGroup("protection", check_protection)


def first_conv_block(model: nn.Module) -> nn.Sequential:
    """The model's first (conv, ReLU, max-pool) block: Anti-GAN's feature extractor C."""
    for module in model.modules():
        children = list(module.children()) if isinstance(module, nn.Sequential) else []
        if children and isinstance(children[0], nn.Conv2d):
            return nn.Sequential(*children[:3])
    raise ValueError("the bottom model has no conv block (protection needs model.kind = 'cnn')")


def protect_party(cfg: ExperimentConfig, bottom: BottomTrainer,
                  on_stuck: Callable[[Stuck], object] | None = None) -> dict[str, Any] | None:
    """Replace the party's train images (its `inputs`) by protected ones; the figures, or None
    when [protection] does not name this party. Deterministic by the run seed, so a resumed
    party protects exactly as it did at the start. ConfigError for a bad [protection].
    `on_stuck`: told where the protection is stuck when it has not returned within
    topology.join_deadline_s (the label party refuses a party not joined by then), from a
    watchdog thread."""
    k = bottom.party_id
    if not cfg.protection.applies(k):
        return None
    protection = configured_protection(cfg)
    inputs = bottom.inputs
    train_ids, _ = train_test_ids(inputs.num_rows, cfg.dataset.test_fraction, cfg.run.seed)
    log.info("party %d: protecting its %d train images with %s", k, train_ids.size,
             cfg.protection.describe())
    images = inputs.numeric[torch.from_numpy(train_ids).to(inputs.device)]
    with _watched(cfg, protection, on_stuck):
        result = protection(images, first_conv_block(bottom.model),
                            derive_seed(cfg.run.seed, "protection", k))
    numeric = inputs.numeric.clone()
    numeric[torch.from_numpy(train_ids).to(inputs.device)] = result.images
    bottom.inputs = replace(inputs, numeric=numeric)
    log.info("party %d: protected in %.1f CPU s", k, result.figures.get("cpu_seconds", 0.0))
    return {"name": cfg.protection.name, "params": protection.params.model_dump(),
            **result.figures}


def _watched(cfg: ExperimentConfig, protection: Protection,
             on_stuck: Callable[[Stuck], object] | None) -> AbstractContextManager[None]:
    if on_stuck is None:
        return nullcontext()
    return watched(cfg.topology.join_deadline_s, on_stuck,
                   suspects([("protection", cfg.protection.name, type(protection))]))


def stuck_protecting(cfg: ExperimentConfig, k: int, stuck: Stuck, then: str) -> str:
    """The sentence of a party whose protection is stuck (protect_party's `on_stuck`)."""
    limit = (f"topology.join_deadline_s = {cfg.topology.join_deadline_s:g} s: a party must have "
             "joined by then")
    return stuck_sentence(f"passive party {k}", "protecting its train images", stuck, limit, then)


def write_figures(run: RunDir, party_id: int, figures: dict[str, Any] | None) -> None:
    """passive_party_<k>/protection.json, written atomically (the report reads it)."""
    if figures is not None:
        path = run.protection(party_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda tmp: tmp.write_text(json.dumps(figures, indent=1)))

