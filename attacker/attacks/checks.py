"""The attacker's plug-in group (splitleak.plugins): the configured attacks exist and accept their
parameters, every attack's own config rules hold, and the artifacts the attacks read."""

from __future__ import annotations

from pydantic import ValidationError

from attacker.attacks import ATTACKS, DEFAULT_ATTACKS, build_attack
from attacker.attacks._centers import CenterAttack, reveal_cap
from splitleak.config import ConfigError, ExperimentConfig, plugin_param_errors
from splitleak.plugins import Artifact, PluginGroup
from splitleak.registry import UnknownPluginError


def check_attacks(cfg: ExperimentConfig) -> None:
    """The attacks [attacker] asks the analysis for exist and accept their parameters, and every
    registered attack's own rules hold (a run-level attack such as EXACT applies where the
    threat model sets up its premise, named or not)."""
    for i, spec in enumerate(cfg.attacker.attacks):
        try:
            build_attack(spec.name, spec.params)
        except UnknownPluginError as err:
            raise ConfigError(f"attacker.attacks[{i}].name: {err}") from None
        except ValidationError as err:
            raise ConfigError(plugin_param_errors(f"attacker.attacks[{i}]", err)) from None
        except (TypeError, ValueError) as err:
            raise ConfigError(f"attacker.attacks[{i}] ({spec.name}): {err}") from None
    for name in ATTACKS.names():
        ATTACKS.get(name).check_config(cfg)


def needed_artifacts(cfg: ExperimentConfig, num_classes: int) -> frozenset[Artifact]:
    """Clean anchors when a binary run's analysis includes an attack that declares it reads them
    (the default attack set does)."""
    if num_classes != 2 or not cfg.tapped_parties:
        return frozenset()
    names = [spec.name for spec in cfg.attacker.attacks] or [name for name, _ in DEFAULT_ATTACKS]
    if any(ATTACKS.get(name).needs_clean_anchors for name in names):
        return frozenset({"clean_anchors"})
    return frozenset()


def capped_hints(cfg: ExperimentConfig) -> list[str]:
    """Hint centers asking for more labels per class than a batch reveals (reveal_cap), so that
    the centers come from fewer."""
    batch = cfg.training.batch_size
    warnings = []
    for i, spec in enumerate(cfg.attacker.attacks):
        attack = build_attack(spec.name, spec.params)
        if not isinstance(attack, CenterAttack) or attack.params.centers != "hint":
            continue
        hints = attack.params.hints
        if 2 * hints > reveal_cap(batch):
            warnings.append(
                f"attacker.attacks[{i}] ({attack.label}): {hints} known labels of each class need "
                f"{2 * hints} rows, but a batch of {batch} rows (training.batch_size) reveals at "
                f"most {reveal_cap(batch)} (half of it, leaving the rest to measure): its class "
                "centers come from those")
    return warnings


def left_out_attacks(cfg: ExperimentConfig) -> list[str]:
    """Run-level attacks of the threat model that a named attacker.attacks leaves out."""
    if not cfg.attacker.enabled or not cfg.attacker.attacks:
        return []
    warning = cfg.threat.left_out([spec.name for spec in cfg.attacker.attacks], "attacker.attacks")
    return [warning] if warning else []


PLUGINS = PluginGroup("attacks", lambda cfg, schema: check_attacks(cfg),
                      lambda cfg, schema: needed_artifacts(cfg, schema.num_classes),
                      lambda cfg, schema: capped_hints(cfg) + left_out_attacks(cfg))
