"""The sweep file (TOML): a base experiment, overrides for every point, named variants, axes.

    [sweep]
    name = "li_tradeoff"               # the sweep directory: <output_dir>/<name>
    base = "../../splitleak/configs/default.toml"   # relative to this file; omit: built-in default
    output_dir = "sweeps"
    seeds = [0, 1, 2]                  # a run.seed axis crossed with everything
    subset = 0.1                       # optional: dataset.subset.fraction of every point
    leak_stat = "flipped_p95"          # the comparison's leak on plots and the frontier

    [set]                              # overrides of every point: config path -> value
    "training.max_steps" = 60

    [axes]                             # a grid: every combination, crossed with every variant
    "topology.passive_parties" = [2, 4]

    [[variant]]                        # named override tables, each with optional own axes
    name = "marvell"
    set = { defense = [{ name = "marvell" }] }
    axes = { "defense.0.s" = [0.1, 0.25, 1, 4] }
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from splitleak.config import (
    DIRECTORY_NAME,
    DIRECTORY_NAME_MAX,
    ExperimentConfig,
    format_validation_error,
    plain_directory_name,
    read_toml_text,
)
from splitleak.filekind import not_a_file
from splitleak.settings import Settings, StrictNonNegativeInt


class SweepError(ValueError):
    """A sweep file that cannot run; the message names the field and what is allowed."""


Axes = dict[str, list[Any]]
EXPERIMENT_SECTIONS = frozenset(ExperimentConfig.model_fields)  # what an experiment file holds


def _check_axes(axes: Axes, where: str) -> None:
    for path, values in axes.items():
        if not values:
            raise ValueError(f"{where} {path!r} has no values; give at least one")
        if len(set(map(_same_value, values))) != len(values):
            raise ValueError(f"{where} {path!r} repeats a value: {values}"
                             + (" (1 and 1.0 are one number)" if len(set(map(repr, values)))
                                == len(values) else ""))


def _same_value(value: Any) -> Any:
    """A key equal for values that configure the same: 1 and 1.0 are one number (a plug-in's
    float parameter reads both as 1.0), a bool stays a bool."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", float(value))
    if isinstance(value, list):
        return ("list", tuple(map(_same_value, value)))
    if isinstance(value, dict):
        return ("table", tuple(sorted((k, _same_value(v)) for k, v in value.items())))
    return ("other", repr(value))


class SweepSection(Settings):
    name: str = Field(pattern=DIRECTORY_NAME, max_length=DIRECTORY_NAME_MAX)
    base: str | None = None  # experiment file relative to the sweep file; None: built-in default
    output_dir: Path = Path("sweeps")
    seeds: list[StrictNonNegativeInt] | None = Field(None, min_length=1)
    subset: float | None = Field(None, gt=0.0, le=1.0)
    description: str = ""
    leak_stat: Literal["flipped_p95", "flipped_mean"] = "flipped_p95"  # the comparison's headline

    _plain_name = field_validator("name")(plain_directory_name)

    @model_validator(mode="after")
    def _unique_seeds(self) -> SweepSection:
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"sweep.seeds repeats a seed: {self.seeds}")
        return self


class VariantSpec(Settings):
    name: str = Field(min_length=1)
    set: dict[str, Any] = {}
    axes: Axes = {}

    @model_validator(mode="after")
    def _axes(self) -> VariantSpec:
        _check_axes(self.axes, f"variant {self.name!r} axis")
        return self


class SweepFile(Settings):
    sweep: SweepSection
    set: dict[str, Any] = {}
    axes: Axes = {}
    variant: list[VariantSpec] = []

    @model_validator(mode="after")
    def _consistent(self) -> SweepFile:
        _check_axes(self.axes, "axis")
        names = [v.name for v in self.variant]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"variant names must be unique; repeated: {', '.join(repeated)}")
        for v in self.variant:
            both = sorted(set(v.axes) & set(self.axes))
            if both:
                raise ValueError(f"variant {v.name!r} axes {both} are also sweep-wide axes; give each "
                                 "path in one place")
        seeded = [where for where, axes in [("axes", self.axes)] + [
            (f"variant {v.name!r} axes", v.axes) for v in self.variant] if "run.seed" in axes]
        if self.sweep.seeds is not None and seeded:
            raise ValueError(f"sweep.seeds and {seeded[0]} both set run.seed; keep one")
        for where, values in [("[set]", self.set)] + [(f"variant {v.name!r} set", v.set)
                                                       for v in self.variant]:
            if "run.seed" in values or "seed" in (values.get("run") or {}):
                raise ValueError(f"{where} sets run.seed, which every point's seed replaces; give "
                                 "the seeds as sweep.seeds = [...] (or a run.seed axis)")
        for where, values in [("[set]", self.set), ("[axes]", self.axes)] + [
                (f"variant {v.name!r} {key}", getattr(v, key)) for v in self.variant
                for key in ("set", "axes")]:
            if "run.output_dir" in values or "output_dir" in (values.get("run") or {}):
                raise ValueError(f"{where} sets run.output_dir, which a sweep does not use (each "
                                 "point runs in <sweep.output_dir>/<sweep.name>/<config hash>); "
                                 "give sweep.output_dir = \"...\" (or --output-dir)")
        return self


def parse_sweep(data: dict[str, Any], source: str = "<dict>") -> SweepFile:
    try:
        return SweepFile.model_validate(data)
    except ValidationError as err:
        raise SweepError(format_validation_error(err, source, "sweep file", SweepFile)) from None


def load_sweep(path: str | Path) -> SweepFile:
    p = Path(path)
    if not p.is_file():
        raise SweepError(f"sweep file {p} {not_a_file(p)}; give the path of a sweep TOML file")
    try:
        data = tomllib.loads(read_toml_text(p, "sweep file", SweepError))
    except tomllib.TOMLDecodeError as err:
        raise SweepError(f"invalid sweep file {p}: not valid TOML: {err}") from None
    if "sweep" not in data and EXPERIMENT_SECTIONS & data.keys():
        raise SweepError(f"{p} is an experiment file (it has no [sweep] table but "
                         f"[{sorted(EXPERIMENT_SECTIONS & data.keys())[0]}]), not a sweep: run it "
                         f"with `splitleak run {p}`, or name it as a sweep file's base "
                         "([sweep] base = ...)")
    return parse_sweep(data, str(p))


def base_path(sweep: SweepFile, source: Path | None) -> Path | None:
    """The base experiment file, relative to the sweep file's folder; None: the built-in default."""
    if sweep.sweep.base is None:
        return None
    base = Path(sweep.sweep.base)
    return base if base.is_absolute() or source is None else source.parent / base
