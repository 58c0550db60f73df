"""Check the configured objective and defense chain before anything starts; errors name the chain
entry. The label party's plug-in group (splitleak.plugins)."""

from __future__ import annotations

from pydantic import ValidationError

from label_party.defenses import DEFENSES, build_defense
from label_party.objectives import OBJECTIVES
from label_party.objectives.base import blamed
from splitleak.config import ConfigError, ExperimentConfig, plugin_param_errors
from splitleak.plugins import PluginGroup
from splitleak.registry import UnknownPluginError


def check_chain(cfg: ExperimentConfig, num_classes: int | None = None) -> None:
    """The objective and every defense of the chain exist and accept their parameters (and the
    dataset's `num_classes`, where known)."""
    try:
        cls = OBJECTIVES.get(cfg.objective.name)
        cls.Params.model_validate(cfg.objective.params)
        with blamed(cls, "check", ConfigError):
            cls.check(cfg, num_classes)  # objective-specific needs (e.g. kdk: features.label_party)
    except UnknownPluginError as err:
        raise ConfigError(f"objective.name: {err}") from None
    except ValidationError as err:
        raise ConfigError(plugin_param_errors("objective", err, cls.Params)) from None
    for i, spec in enumerate(cfg.defense):
        try:
            build_defense(spec.name, spec.params)
        except UnknownPluginError as err:
            raise ConfigError(f"defense[{i}].name: {err}") from None
        except ValidationError as err:
            raise ConfigError(f"{spec.name}: "
                              f"{plugin_param_errors(f'defense[{i}]', err, DEFENSES.get(spec.name).Params)}"
                              ) from None
        if DEFENSES.get(spec.name).binary_only and num_classes not in (None, 2):
            raise ConfigError(f"defense[{i}]: {spec.name} is defined for two classes; "
                              f"{cfg.dataset.name} has {num_classes} (allowed: a two-class "
                              "dataset, or another defense)")
    if (any(DEFENSES.get(spec.name).needs_class_gradients for spec in cfg.defense)
            and not cls.supports_class_gradients):
        raise ConfigError(class_gradients_error(cfg))


def class_gradients_error(cfg: ExperimentConfig) -> str:
    """Why a chain that reads per-class gradients cannot run with this objective."""
    needing = sorted({s.name for s in cfg.defense if DEFENSES.get(s.name).needs_class_gradients})
    allowed = [n for n in OBJECTIVES.names() if OBJECTIVES.get(n).supports_class_gradients]
    return (f"defense {', '.join(needing)} needs the per-class gradients of the objective, and "
            f"objective {cfg.objective.name!r} has none (its loss is not a supervised loss "
            f"on labels); allowed objectives: {', '.join(allowed)}")


PLUGINS = PluginGroup("objective and defense chain",
                      lambda cfg, schema: check_chain(cfg, schema.num_classes))
