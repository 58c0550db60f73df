"""The points of a sweep: every variant crossed with the grid of axes, each an ordinary config."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestration.sweep.overrides import OverrideError, apply
from orchestration.sweep.spec import SweepError, SweepFile, VariantSpec
from splitleak.config import ConfigError, ExperimentConfig, parse_config

Override = tuple[str, Any]
SEED = "run.seed"  # the axis `sweep.seeds` adds; a setting is its points across it


@dataclass(frozen=True)
class Point:
    """One experiment of a sweep; its config hash names its run directory."""

    index: int
    variant: str
    axes: tuple[Override, ...]  # the axis values that tell it apart within its variant
    overrides: tuple[Override, ...]  # every override applied to the base, in order
    config: ExperimentConfig
    run_dir: Path

    @property
    def hash(self) -> str:
        return self.config.hash

    @property
    def seed(self) -> int:
        return self.config.run.seed

    @property
    def setting(self) -> str:
        """The point without its seed: what the comparison groups seeds by. Each axis by its
        path as the sweep file wrote it (`marvell, defense.0.s=4.0`): one name per knob."""
        shown = [f"{path}={_show(value)}" for path, value in self.setting_axes]
        return ", ".join([self.variant, *shown])

    @property
    def setting_axes(self) -> tuple[Override, ...]:
        """The axis values that tell the point's setting apart (its seed left out)."""
        return tuple((path, value) for path, value in self.axes if path != SEED)

    @property
    def label(self) -> str:
        return f"{self.setting}, seed={self.seed}"

    def overrides_json(self) -> str:
        return json.dumps(dict(self.overrides), default=str)

    def axes_json(self) -> str:
        return json.dumps(dict(self.setting_axes), default=str)


def _set_by(error: str, keys: list[tuple[str, str]]) -> str:
    """Which key of the sweep file set the field a point's error names (the last to set it
    wins), e.g. ` (set by the sweep file's [set] "training.epochz")`; '' where none did."""
    error = re.sub(r"\[(\d+)\]", r".\1", error)  # a plug-in's defense[0].s: defense.0.s
    for path, where in reversed(keys):
        if re.search(rf"(?m)(^|\s){re.escape(path)}(?=[.:])", error):
            return f' (set by the sweep file\'s {where} "{path}")'
    return ""


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def _applied(data: dict[str, Any], overrides: list[Override], where: str) -> dict[str, Any]:
    for path, value in overrides:
        try:
            data = apply(data, path, value)
        except OverrideError as err:
            raise SweepError(f"{where} {path!r}: {err}") from None
    return data


def resolve(sweep: SweepFile, base: ExperimentConfig, sweep_dir: Path,
            check: Callable[[ExperimentConfig], ExperimentConfig] | None = None) -> list[Point]:
    """Every point, in order: variants (or the base alone), each crossed with the sweep-wide
    axes, its own axes and the seeds. `check` validates a point's config beyond the schema
    (e.g. against its dataset); a bad point raises SweepError naming it and the field."""
    start = _applied(base.model_dump(mode="json"), list(sweep.set.items()), "set")
    variants = sweep.variant or [VariantSpec(name=base.run.name)]
    points: list[Point] = []
    seen: dict[str, str] = {}
    for i, variant in enumerate(variants):
        own = list(variant.set.items())
        data = _applied(start, own, f"variant[{i}] ({variant.name!r}) set")
        axes: dict[str, list[Any]] = {**sweep.axes, **variant.axes}
        if sweep.sweep.seeds is not None:
            axes[SEED] = list(sweep.sweep.seeds)
        for values in itertools.product(*axes.values()):
            combo = list(zip(axes, values, strict=True))
            point_data = _applied(data, combo, f"variant {variant.name!r} axis" if sweep.variant
                                  else "axis")  # without variants, the base config's name is no variant
            extra: list[Override] = []
            if sweep.sweep.subset is not None:
                extra = [("dataset.subset", {"fraction": sweep.sweep.subset})]
                point_data = _applied(point_data, extra, "sweep.subset:")
            keys = [*((path, "[set]") for path in sweep.set), *((path, f"variant {variant.name!r} set")
                                                                for path, _ in own),
                    *((path, f"variant {variant.name!r} axes" if path in variant.axes else "[axes]")
                      for path, _ in combo), *((path, "sweep.subset") for path, _ in extra)]
            point = _point(len(points), variant.name, combo, [*sweep.set.items(), *own, *combo, *extra],
                           point_data, sweep_dir, check,
                           f"variant {variant.name!r}" if sweep.variant else "the base config", keys)
            if point.hash in seen:
                raise SweepError(f"points {seen[point.hash]!r} and {point.label!r} are the same "
                                 f"experiment (config hash {point.hash}); drop one")
            seen[point.hash] = point.label
            points.append(point)
    return points


def _point(index: int, variant: str, combo: list[Override], overrides: list[Override],
           data: dict[str, Any], sweep_dir: Path,
           check: Callable[[ExperimentConfig], ExperimentConfig] | None, named: str,
           keys: list[tuple[str, str]]) -> Point:
    shown = ", ".join(f"{p}={_show(v)}" for p, v in combo)
    where = f"point {index} ({named}{'; ' + shown if shown else ''})"
    try:
        cfg = parse_config(data, where)
        if check is not None:  # validated, and resolved as the point's run directory records it
            cfg = check(cfg)
    except ConfigError as err:
        text = str(err)
        raise SweepError((text if text.startswith("invalid config") else
                          f"invalid config {where}: {text}") + _set_by(text, keys)) from None
    return Point(index, variant, tuple(combo), tuple(overrides), cfg, sweep_dir / cfg.hash)
