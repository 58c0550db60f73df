"""The run-level attacks of an analysis (model completion, EXACT, feature reconstruction,
integrity), once per attacker, as summary entries; a failure becomes a warning."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attacker.analysis.inputs import AnalysisInputError
from attacker.attacks import AttackRefused, RunContext
from attacker.attacks.integrity.base import IntegrityAttack
from splitleak.config import ConfigError, load_config
from splitleak.placement import ATTACKER, requested_device, resolve_device

if TYPE_CHECKING:
    from attacker.analysis.analyze import Analysis


def below_prior(figures: dict[str, Any]) -> str | None:
    """"SSIM 0.10 < 0.16" where a reconstruction's headline (or CAFE's PSNR) is below its
    prior's, every one of them higher-is-better; None when none is."""
    prior = figures.get("prior") or {}
    key = "ssim" if figures.get("metric") == "ssim" else "value"
    pairs = [(figures.get("metric", "value"), figures.get(key), prior.get(key)),
             ("PSNR", figures.get("psnr"), figures.get("psnr_prior"))]
    below = [f"{name} {mine:.3g} < {theirs:.3g}" for name, mine, theirs in pairs
             if isinstance(mine, float) and isinstance(theirs, float) and mine < theirs]
    return "; ".join(below) or None


def run_level_entries(analysis: Analysis) -> list[dict[str, Any]]:
    """Run-level attacks (model completion) once per attacker; a failure becomes a warning."""
    entries: list[dict[str, Any]] = []
    cfg = None
    for unit in analysis.run_units():
        for attack in analysis.run_attacks(unit):
            if cfg is None:
                try:
                    cfg = load_config(analysis.run.config)
                except ConfigError as err:
                    analysis.warnings.append(f"{attack.label}: cannot read the run's config: {err}")
                    return entries
            field = "--device" if analysis.device else "run.devices.attacker"
            device = resolve_device(analysis.device or requested_device(cfg, ATTACKER), field)
            context = RunContext(analysis.run, cfg, unit.parties, unit.seed, analysis.train_ids,
                                 analysis.test_ids, analysis.labels, device=device,
                                 written=analysis.staged)
            threat = (f"{analysis.threat.receiver.describe()}; victim: party {unit.key}"
                      if attack.receiver else analysis.threat.describe(list(unit.parties)))
            entry = {"party_id": unit.parties[0], "parties": list(unit.parties),
                     "layer": "input" if attack.receiver else "bottom",
                     "attack": attack.label, "name": attack.name, "scope": "run", "epoch": None,
                     "side_knowledge": attack.side_knowledge, "threat": threat, "metric": "accuracy",
                     "seed": unit.seed, "draws": 1, "batches": 1, "skipped": 0, "degenerate": 0}
            if attack.diagnostic is not None:
                entry["diagnostic"] = attack.diagnostic
            try:
                result = attack.run(context)
            except AttackRefused as err:
                raise AnalysisInputError(str(err)) from None
            except ValueError as err:
                analysis.warnings.append(f"{attack.label}, parties {unit.key}: {err}")
                entries.append({**entry, "skipped": 1, "error": str(err),  # where its table is
                                **({"layer": "output"} if isinstance(attack, IntegrityAttack) else {})})
                continue
            value = result.accuracy
            analysis.warnings += [f"{attack.label}, parties {unit.key}: {w}" for w in result.warnings]
            if isinstance(attack, IntegrityAttack):
                entries.append({**entry, "layer": "output", "metric": result.metric,
                                "integrity": result.figures,
                                result.metric: {"mean": value, "p95": value, "max": value, "n": 1}})
                continue
            if attack.receiver:
                entries.append({**entry, "metric": result.metric, "reconstruction": result.figures,
                                result.metric: {"mean": value, "p95": value, "max": value, "n": 1}})
                below = below_prior(result.figures)
                if below:
                    analysis.warnings.append(
                        f"{attack.label}, victim {unit.key}: the reconstruction scores below the "
                        f"prior, a constant guess ({below}): the attack did not fit the data here "
                        "(too few steps, too large a step size, or too little signal), so its "
                        "figure is no measure of the leak")
                continue
            entries.append({**entry, "accuracy": {"mean": value, "p95": value, "max": value, "n": 1},
                            "pooled": {"accuracy": value, "correct": result.correct,
                                       "rows": result.rows, "no_prediction": 0},
                            FIGURES_KEY.get(attack.name, "completion"): result.figures})
    return entries


FIGURES_KEY = {"exact": "exact"}  # where a run attack's figures go in its summary entry
