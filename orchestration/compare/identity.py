"""Which setting a run belongs to: what its sweep wrote in sweep.parquet (setting, variant, axes,
overrides), read back as it was written, and only for a run outside a sweep what its config says.

A sweep's names are the ones its file used: the variant is the defense family, each axis is
named by its config path (`defense.0.s`) and the numeric ones are the strengths. A plain folder
of runs has no such names: its family is the plug-ins the config chains (`marvell`), its
strengths their numeric parameters (`marvell.s`). Either way the baseline of a set-up is the
setting whose config has no defense: a fact of the config, not a name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestration.sweep.points import SEED
from splitleak.artifacts.paths import SweepDir
from splitleak.artifacts.sweep import read_index_rows
from splitleak.config import ExperimentConfig, leaves

# How a run was executed, not what it trains: its seeds are one setting, whatever the threads
# or whether the parties replayed CUDA graphs.
NOT_THE_EXPERIMENT = ("seed", "name", "output_dir", "torch_threads", "cuda_graphs")
NO_DEFENSE = "no defense"


@dataclass(frozen=True)
class SweepPoint:
    """A run as its sweep's index describes it."""

    sweep: str  # the sweep directory (resolved): settings of two sweeps never merge
    setting: str  # e.g. "marvell, defense.0.s=4.0"
    variant: str
    axes: dict[str, Any] | None  # path -> value, the seed left out; None: an index from before
    overrides: dict[str, Any]  # every override of the base, path -> value


def finished_points(sweep_dir: Path) -> list[tuple[Path, SweepPoint]]:
    """The run directory and index row of every finished point of a sweep."""
    where = str(sweep_dir.resolve())
    return [(SweepDir(sweep_dir).point(row.run_dir).root,
             SweepPoint(where, row.setting, row.variant, row.axes_dict(),
                        {k: v for k, v in row.overrides_dict().items() if k != SEED}))
            for row in read_index_rows(sweep_dir) if row.status == "done"]


@dataclass(frozen=True)
class Identity:
    key: str  # what groups a setting's seeds
    label: str
    family: str
    strengths: dict[str, float]
    defenseless: bool  # the config has no defense: its set-up's baseline
    overrides: dict[str, Any] | None  # what the sweep set (None outside a sweep)


def identify(cfg: ExperimentConfig, point: SweepPoint | None) -> Identity:
    """A sweep point's identity as the sweep wrote it; derived from the config only for a run
    outside a sweep (or one in an index written before axes were)."""
    defenseless = family(cfg) == NO_DEFENSE
    if point is not None and point.axes is not None:
        numeric = {path: float(value) for path, value in point.axes.items()
                   if isinstance(value, int | float) and not isinstance(value, bool)}
        return Identity(_digest({"sweep": point.sweep, "setting": point.setting}), point.setting,
                        point.variant, numeric, defenseless, point.overrides)
    return Identity(setting_key(cfg), point.setting if point else _label(cfg), family(cfg),
                    strengths(cfg), defenseless, point.overrides if point else None)


def _digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _experiment(cfg: ExperimentConfig) -> dict[str, Any]:
    data = cfg.model_dump(mode="json", exclude={"evaluation"})  # resolved, not chosen
    for key in NOT_THE_EXPERIMENT:
        data["run"].pop(key, None)
    return data


def setting_key(cfg: ExperimentConfig) -> str:
    """The config without what does not change the experiment (its seed, name, directory)."""
    return _digest(_experiment(cfg))


def setup_key(cfg: ExperimentConfig) -> str:
    """The set-up a defense is applied to: the setting without defense, objective,
    [protection], [network] and [wire], and without [attacker]: which attacks analyse a run
    does not change its training (e.g. a sweep trains model completion's baselines only in its
    no-defense runs)."""
    data = _experiment(cfg)
    for key in ("defense", "objective", "protection", "network", "wire", "attacker"):
        data.pop(key)
    return _digest(data)


SHOWN_DIFFERENCES = 2  # config paths a label names at least, where several set-ups share its name


def telling_apart(configs: list[ExperimentConfig]) -> list[str] | None:
    """For settings that share a name, what tells each apart: the config paths whose values
    differ among them, as `threat.parties.1.optimizer=malicious` (the first two, more where
    those two do not tell every one apart, then `…` for the rest); None when the configs are
    the same (one config in two sweeps, say)."""
    flat = [dict(leaves(_experiment(cfg))) for cfg in configs]

    def said(f: dict[str, Any], path: str) -> str:  # a path one config lacks reads "unset"
        return _value(f[path]) if path in f else "unset"

    paths = [path for path in dict.fromkeys(p for f in flat for p in f)
             if len({said(f, path) for f in flat}) > 1]
    if not paths:
        return None
    shown = SHOWN_DIFFERENCES
    while len({tuple(said(f, p) for p in paths[:shown]) for f in flat}) < len(flat) \
            and shown < len(paths):
        shown += 1
    more = ", …" if len(paths) > shown else ""
    return [", ".join(f"{path} = {said(f, path)}" for path in paths[:shown]) + more for f in flat]


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return value if isinstance(value, str) else "none" if value is None else json.dumps(value)


def family(cfg: ExperimentConfig) -> str:
    """The defense family: the objective (unless plain cross-entropy) and the gradient chain."""
    names = ([cfg.objective.name] if cfg.objective.name != "cross_entropy" else []) + [
        d.name for d in cfg.defense if d.name != "no_noise"]
    if cfg.protection.name != "none":
        names.append(cfg.protection.name)
    if cfg.wire.dtype != "float32":
        names.append(f"{cfg.wire.dtype} wire")
    return "+".join(names) or NO_DEFENSE


def strengths(cfg: ExperimentConfig) -> dict[str, float]:
    """The numeric parameters of the family's plug-ins, e.g. {"marvell.s": 4.0}."""
    specs = ([cfg.objective] if cfg.objective.name != "cross_entropy" else []) + list(cfg.defense)
    params = [(spec.name, spec.params) for spec in specs]
    if cfg.protection.name != "none":
        params.append((cfg.protection.name, cfg.protection.params))
    return {f"{name}.{k}": float(v) for name, given in params for k, v in given.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def _label(cfg: ExperimentConfig) -> str:
    params = ", ".join(f"{k.split('.', 1)[1]}={v:g}" for k, v in strengths(cfg).items())
    return f"{family(cfg)}{' ' + params if params else ''}"
