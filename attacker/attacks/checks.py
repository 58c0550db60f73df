"""The attacker's plug-in group (splitleak.plugins): the configured attacks exist and accept their
parameters, every attack's own config rules hold, and the artifacts the attacks read."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from attacker.attacks import ATTACKS, DEFAULT_ATTACKS, HINT_ATTACKS, Attack, build_attack
from attacker.attacks._centers import CenterAttack, reveal_cap
from attacker.attacks.base import RunFacts
from splitleak.config import ConfigError, ExperimentConfig, plugin_param_errors
from splitleak.plugins import Artifact, PluginGroup
from splitleak.provenance import blamed
from splitleak.registry import UnknownPluginError


def check_attacks(cfg: ExperimentConfig, num_classes: int) -> None:
    """The attacks [attacker] asks the analysis for exist and accept their parameters, and every
    registered attack's own rules hold (a run-level attack such as EXACT applies where the
    threat model sets up its premise, named or not), and every named batch attack scores the
    dataset's task."""
    for i, spec in enumerate(cfg.attacker.attacks):
        try:
            build_attack(spec.name, spec.params)
        except UnknownPluginError as err:
            raise ConfigError(f"attacker.attacks[{i}].name: {err}") from None
        except ValidationError as err:
            raise ConfigError(plugin_param_errors(f"attacker.attacks[{i}]", err,
                                                  ATTACKS.get(spec.name).Params)) from None
        except (TypeError, ValueError) as err:
            raise ConfigError(f"attacker.attacks[{i}] ({spec.name}): {err}") from None
    for name in ATTACKS.names():
        cls = ATTACKS.get(name)
        with blamed("attack", name, cls, "check_config", ConfigError):
            cls.check_config(cfg)
    check_task(((spec.name, spec.params) for spec in cfg.attacker.attacks), num_classes,
               lambda i: f"attacker.attacks[{i}]", cfg.dataset.name)


def check_task(specs: Iterable[tuple[str, dict[str, Any]]], num_classes: int,
               field: Callable[[int], str], dataset: str) -> None:
    """ConfigError when a named batch attack cannot score a task with `num_classes` classes (a
    score attack on a multi-class run): the analysis would leave it out, and a run naming only
    such attacks would end with an empty leak table. `field(i)` names the i-th attack."""
    for i, (name, params) in enumerate(specs):
        attack = build_attack(name, params)
        if isinstance(attack, Attack) and not attack.applies_to(num_classes):
            raise ConfigError(
                f"{field(i)} ({attack.label}): it ranks two classes (one score per row), and "
                f"{dataset} has {num_classes} classes, so it would not run; allowed for "
                f"{num_classes} classes: {', '.join(attacks_for(num_classes))}, or the run-level "
                "attacks of the threat model")


def attacks_for(num_classes: int) -> list[str]:
    """The batch attacks that score a task with this many classes, by name."""
    built = [build_attack(name, {}) for name in ATTACKS.names()]
    return [a.name for a in built if isinstance(a, Attack) and a.applies_to(num_classes)]


def premise_warnings(cfg: ExperimentConfig) -> list[str]:
    """Named attacks whose premise this run's set-up denies at every layer (e.g. direct_label
    with a top model): they run, and the report marks every batch not applicable."""
    facts = RunFacts(top_model=cfg.model.top != "none", perturbed=False, colluding=False)
    warnings = []
    for i, spec in enumerate(cfg.attacker.attacks):
        attack = build_attack(spec.name, spec.params)
        reason = attack.premise(facts, "cut") if isinstance(attack, Attack) else None
        if reason is not None:
            warnings.append(f"attacker.attacks[{i}] ({attack.label}) {reason}: the report will "
                            "show it as not applicable on every batch")
    return warnings


def needed_artifacts(cfg: ExperimentConfig, num_classes: int) -> frozenset[Artifact]:
    """Clean anchors when a binary run's analysis includes an attack that declares it reads them
    (the default attack set does)."""
    if num_classes != 2 or not cfg.tapped_parties:
        return frozenset()
    names = [spec.name for spec in cfg.attacker.attacks] or [name for name, _ in DEFAULT_ATTACKS]
    if any(ATTACKS.get(name).needs_clean_anchors for name in names):
        return frozenset({"clean_anchors"})
    return frozenset()


Specs = list[tuple[str, dict[str, Any]]]  # attacks by name and parameters, as they run


def _named(cfg: ExperimentConfig, specs: Specs | None) -> Specs:
    """The attacks named for the analysis: `specs` (e.g. --attacks), else attacker.attacks."""
    return [(spec.name, spec.params) for spec in cfg.attacker.attacks] if specs is None else specs


def unscorable_hints(cfg: ExperimentConfig, num_classes: int, specs: Specs | None = None,
                     hints: list[int] | None = None, field: str = "attacker.attacks") -> list[str]:
    """Hint counts k that leave a full batch at most one row once its k known positives are
    left out (k ≥ batch_size − 1), where no batch keeps a positive and a negative to score: the
    hint attacks with that k skip every batch. Only where the analysis runs hint attacks (a
    binary run's defaults, or named in `specs` / attacker.attacks, which `field` names); a k
    named there wins over the threat model's hints (or `hints`, --hints, where given)."""
    batch = cfg.training.batch_size
    attacks = _named(cfg, specs)
    named = [(i, name, params) for i, (name, params) in enumerate(attacks) if name in HINT_ATTACKS]
    if attacks:
        uses_party_hints = any("k" not in params for _, _, params in named)
    else:
        uses_party_hints = num_classes == 2
    warnings = []
    why = (f"per batch of {batch} rows (training.batch_size) leave at most one row to infer, "
           "never a positive and a negative: the hint attacks with")
    if uses_party_hints:
        given = [("--hints", hints)] if hints is not None else [
            (f"threat.parties.{party}.hints", threat.hints)
            for party, threat in sorted(cfg.threat.parties.items())]
        for where, ks in given:
            over = [k for k in ks if k >= batch - 1]
            if over:
                warnings.append(f"{where}: {over} known positives {why} "
                                f"{'these' if len(over) > 1 else 'this'} k will skip every batch")
    for i, name, params in named:
        k = params.get("k")
        if k is not None and k >= batch - 1:
            warnings.append(f"{field}[{i}] ({build_attack(name, params).label}): {k} known "
                            f"positives {why} this k will skip every batch")
    return warnings


def capped_hints(cfg: ExperimentConfig, specs: Specs | None = None,
                 field: str = "attacker.attacks") -> list[str]:
    """Hint centers asking for more labels per class than a batch reveals (reveal_cap), so that
    the centers come from fewer (`specs` / `field` as for unscorable_hints)."""
    batch = cfg.training.batch_size
    warnings = []
    for i, (name, params) in enumerate(_named(cfg, specs)):
        attack = build_attack(name, params)
        if not isinstance(attack, CenterAttack) or attack.params.centers != "hint":
            continue
        hints = attack.params.hints
        if 2 * hints > reveal_cap(batch):
            warnings.append(
                f"{field}[{i}] ({attack.label}): {hints} known labels of each class need "
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


PLUGINS = PluginGroup("attacks", lambda cfg, schema: check_attacks(cfg, schema.num_classes),
                      lambda cfg, schema: needed_artifacts(cfg, schema.num_classes),
                      lambda cfg, schema: unscorable_hints(cfg, schema.num_classes)
                      + capped_hints(cfg) + left_out_attacks(cfg)
                      + premise_warnings(cfg))
