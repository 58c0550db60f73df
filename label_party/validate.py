"""Check the configured defense chain before anything starts; errors name the chain entry."""

from __future__ import annotations

from pydantic import ValidationError

from label_party.defenses import build_defense
from label_party.objectives import OBJECTIVES
from splitleak.config import ConfigError, ExperimentConfig
from splitleak.registry import UnknownPluginError


def check_chain(cfg: ExperimentConfig) -> None:
    """The objective and every defense of the chain exist and accept their parameters."""
    try:
        cls = OBJECTIVES.get(cfg.objective.name)
        cls.Params.model_validate(cfg.objective.params)
    except UnknownPluginError as err:
        raise ConfigError(f"objective.name: {err}") from None
    except ValidationError as err:
        problems = "; ".join(f"objective.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in err.errors())
        raise ConfigError(f"objective ({cfg.objective.name}): {problems}") from None
    for i, spec in enumerate(cfg.defense):
        try:
            build_defense(spec.name, spec.params)
        except UnknownPluginError as err:
            raise ConfigError(f"defense[{i}].name: {err}") from None
        except ValidationError as err:
            problems = "; ".join(f"defense[{i}].{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                 for e in err.errors())
            raise ConfigError(f"defense[{i}] ({spec.name}): {problems}") from None
