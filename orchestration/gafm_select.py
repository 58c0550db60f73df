"""GAFM's Δ selection (Appendix D.3) as a sweep: train on random 10 % subsets, keep the Δ with
the lowest mean leakAUC/trainAUC.

The sweep's points are Δ × repeat: repeat r has the run seed `derive_seed(seed, "gafm_select",
"run", r)` and, through `dataset.subset` (seeded by the run seed), its own random subset
(without replacement) of `fraction` of the train rows and of the test rows. Within a repeat
every Δ sees the same subset and the same initialisation (a paired comparison); repeats differ
in both. Each point is an ordinary distributed run with its analysis, on the local engine or
on a Ray cluster; its run directory is named by its config hash, so an interrupted selection
resumes where it stopped when given the same `output_dir`.

- leakAUC: mean over the batches of the flip-corrected per-batch leak AUC max(AUC, 1 − AUC) at
  the cut layer, averaged over the observed parties and over `attacks` (default: the norm attack
  alone; the paper averages the ratio over norm, mean and median attacks: pass
  `attacks=("norm", "mean", "median")` — mean and median use oracle class centers, as GAFM
  evaluates them). Single-class batches are skipped, as in the report.
- trainAUC: ROC AUC of the trained model's prediction on the subset's train rows (the final
  evaluation also scores the train rows: `training.eval_train`).
- ratio = leakAUC / trainAUC per (Δ, repeat); the selected Δ has the lowest mean ratio over the
  repeats (ties: the smaller Δ).

Entry points: `select_delta(cfg, ...)` and `main(argv)` (`splitleak gafm-select CONFIG`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console

from orchestration.sweep.arguments import add_engine_arguments
from splitleak.arguments import float_in, int_in, writable_dir, writable_file
from splitleak.config import ConfigError, ExperimentConfig
from splitleak.seeding import derive_seed

if TYPE_CHECKING:
    from orchestration.sweep.engine import Engine
    from orchestration.sweep.points import Point

DELTAS = (0.05, 0.1, 0.2, 0.3, 0.5)
ATTACK_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "norm": ("norm", {}),
    "mean": ("mean", {"centers": "oracle"}),
    "median": ("median", {"centers": "oracle"}),
}


@dataclasses.dataclass(frozen=True)
class DeltaTrial:
    delta: float
    repeat: int
    seed: int  # the run seed of this repeat (initialisation and batch order)
    train_rows: int
    leak_auc: float
    train_auc: float
    test_auc: float | None

    @property
    def ratio(self) -> float:
        return self.leak_auc / self.train_auc if self.train_auc > 0 else float("inf")


@dataclasses.dataclass(frozen=True)
class DeltaSelection:
    best_delta: float
    mean_ratio: dict[float, float]
    trials: list[DeltaTrial]
    fraction: float
    repeats: int
    attacks: tuple[str, ...]
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return {"best_delta": self.best_delta,
                "mean_ratio": {str(d): r for d, r in self.mean_ratio.items()},
                "trials": [{**dataclasses.asdict(t), "ratio": t.ratio} for t in self.trials],
                "fraction": self.fraction, "repeats": self.repeats, "attacks": list(self.attacks),
                "seed": self.seed,
                "leak_auc": "mean flip-corrected per-batch cut-layer leak AUC over "
                            f"{', '.join(self.attacks)}",
                "train_auc": "ROC AUC of the prediction on the subset's train rows"}


class SelectionFailed(RuntimeError):
    """A trial run failed; the message names the trial and why."""


def _sweep_base(cfg: ExperimentConfig, attacks: Sequence[str]) -> ExperimentConfig:
    """The trials' shared config: attacker on with only the chosen attacks, train rows scored."""
    data = cfg.model_dump(mode="json")
    data["attacker"]["enabled"] = True
    data["attacker"]["attacks"] = [{"name": ATTACK_SPECS[a][0], **ATTACK_SPECS[a][1]} for a in attacks]
    data["training"]["eval_train"] = True
    return ExperimentConfig.model_validate(data)


def _trial(point: Point, repeat: int, attacks: Sequence[str]) -> DeltaTrial:
    """leakAUC, trainAUC and test AUC of one finished trial run."""
    from orchestration.compare.read import read_run

    result = read_run(point.run_dir)
    names = {ATTACK_SPECS[a][0] for a in attacks}
    leaks = [e.flipped_mean for e in result.leak if e.layer == "cut" and e.flipped_mean is not None
             and e.attack.split("(")[0] in names]
    if not leaks:
        raise ValueError(f"no batch with both classes in the subset of trial {point.label}: raise the "
                         "fraction or the batch size")
    final = result.final_eval
    train_auc = final.get("train_auc")
    return DeltaTrial(float(point.config.objective.params["delta"]), repeat, point.seed,
                      int(final.get("train_rows") or 0), float(np.mean(leaks)),
                      float(train_auc) if train_auc is not None else math.nan, final.get("test_auc"))


def select_delta(cfg: ExperimentConfig, *, deltas: Sequence[float] = DELTAS, fraction: float = 0.1,
                 repeats: int = 5, attacks: Sequence[str] = ("norm",),
                 output_dir: Path | None = None, engine: Engine | None = None,
                 console: Console | None = None) -> DeltaSelection:
    """Run the selection as a sweep on `engine` (default: the local engine); the trial run
    directories go under `output_dir`/gafm_select (a temporary directory if None)."""
    if cfg.objective.name != "gafm":
        raise ConfigError(f"Δ selection is for objective 'gafm'; the config has "
                          f"objective.name = {cfg.objective.name!r}")
    unknown = sorted(set(attacks) - set(ATTACK_SPECS))
    if unknown:
        raise ConfigError(f"unknown attacks {unknown}; allowed: {', '.join(ATTACK_SPECS)}")
    if not 0 < fraction <= 1:
        raise ConfigError(f"fraction must be in (0, 1], got {fraction}")
    if any(not 0 <= d <= 0.5 for d in deltas):
        raise ConfigError(f"every Δ must be in [0, 0.5], got {list(deltas)}")
    if repeated := repeated_deltas(deltas):
        raise ConfigError(f"deltas repeat {repeated}: give each candidate Δ once")
    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {repeats}")
    from orchestration.sweep.index import SweepIndex
    from orchestration.sweep.local import LocalEngine
    from orchestration.sweep.points import resolve
    from orchestration.sweep.runner import run_points
    from orchestration.sweep.spec import SweepError, parse_sweep
    from splitleak.validation import validated

    seeds = [derive_seed(cfg.run.seed, "gafm_select", "run", r) % 2**31 for r in range(repeats)]
    sweep = parse_sweep({"sweep": {"name": "gafm_select", "seeds": seeds, "subset": fraction},
                         "axes": {"objective.delta": [float(d) for d in deltas]}}, "gafm-select")
    engine = engine or LocalEngine()
    if cfg.network.shaped:  # as `splitleak sweep` refuses it, before any trial runs
        from orchestration.sweep.command import check_engine_emulates

        check_engine_emulates(f"the config ({cfg.network.describe()})", engine)
    with tempfile.TemporaryDirectory(prefix="gafm-select-") as scratch:
        sweep_dir = Path(output_dir if output_dir is not None else scratch) / sweep.sweep.name
        try:
            points = resolve(sweep, _sweep_base(cfg, attacks), sweep_dir, check=validated)
        except SweepError as err:
            raise ConfigError(str(err)) from None
        index = SweepIndex(sweep_dir, points, engine.name)
        run_points(points, index, engine, retry_failed=True, console=console,
                   show_progress=console is not None)
        failed = [row for row in index.rows.values() if row["status"] != "done"]
        if failed:
            raise SelectionFailed("; ".join(f"trial {r['label']} {r['status']}: {r['message']}"
                                            for r in failed))
        trials = sorted((_trial(p, seeds.index(p.seed), attacks) for p in points),
                        key=lambda t: (t.repeat, t.delta))
    mean_ratio = {float(d): float(np.mean([t.ratio for t in trials if t.delta == d])) for d in deltas}
    best = min(sorted(mean_ratio), key=lambda d: mean_ratio[d])
    return DeltaSelection(best, mean_ratio, trials, fraction, repeats, tuple(attacks), cfg.run.seed)


def repeated_deltas(deltas: Sequence[float]) -> list[float]:
    """The Δ values given more than once (each would be the same trial run twice)."""
    return sorted(d for d, n in Counter(map(float, deltas)).items() if n > 1)


class _Deltas(argparse.Action):
    """--deltas: refused (exit 2) when a value repeats, before any trial runs."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if repeated := repeated_deltas(values):
            parser.error(f"argument --deltas: {', '.join(f'{d:g}' for d in repeated)} given "
                         "more than once; give each candidate Δ once")
        setattr(namespace, self.dest, values)


def subsets(selection: DeltaSelection) -> str:
    """E.g. `5 random 10% subsets (43 train rows each)`: the share as given (0.1%, not 0%) and
    the rows it came to, which a small share makes too few to mean much."""
    rows = sorted({t.train_rows for t in selection.trials})
    each = f"{rows[0]}" if len(rows) == 1 else f"{rows[0]}-{rows[-1]}"
    return (f"{selection.repeats} random {100 * selection.fraction:.3g}% subset"
            f"{'s' if selection.repeats > 1 else ''} ({each} train rows each)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="experiment TOML with objective.name = 'gafm'")
    parser.add_argument("--deltas", type=float_in(0.0, 0.5), nargs="+", default=list(DELTAS),
                        action=_Deltas,
                        help="candidate Δ values (default: %(default)s)")
    parser.add_argument("--fraction", type=float_in(0.0, 1.0, low_open=True), default=0.1,
                        help="share of the train (and test) rows per subset (default: 0.1)")
    parser.add_argument("--repeats", type=int_in(1, 1000), default=5,
                        help="random subsets (default: 5)")
    parser.add_argument("--attacks", nargs="+", default=["norm"], choices=sorted(ATTACK_SPECS),
                        help="attacks whose leak AUCs are averaged (default: norm)")
    parser.add_argument("--output-dir", type=writable_dir, help="keep the trial run directories here (and "
                        "resume an interrupted selection from them)")
    parser.add_argument("--json", type=writable_file, help="also write the selection as JSON here")
    add_engine_arguments(parser)


def run_cli(args: argparse.Namespace) -> int:
    from orchestration.sweep.command import build_engine
    from splitleak.cli_common import (
        EXIT_BAD_INPUT,
        EXIT_FAILED,
        EXIT_INTERRUPTED,
        BadInput,
        config_or_exit,
    )
    from splitleak.validation import validate

    cfg = config_or_exit(args.config)
    output_dir = args.output_dir
    if args.shared_dir is not None:  # the roles write the trials in place: on the shared mount
        if output_dir is not None:
            raise BadInput(f"--output-dir {output_dir} and --shared-dir {args.shared_dir} both "
                           "say where the trials go (with --shared-dir: SHARED_DIR/gafm_select, "
                           "which every node mounts): drop one")
        output_dir = args.shared_dir.resolve()
    try:
        validate(cfg)
        selection = select_delta(cfg, deltas=args.deltas, fraction=args.fraction,
                                 repeats=args.repeats, attacks=args.attacks,
                                 output_dir=output_dir, engine=build_engine(args),
                                 console=Console(stderr=True))
    except ConfigError as err:
        print(f"invalid config {args.config}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (SelectionFailed, ValueError) as err:
        print(f"Δ selection failed: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted: every trial was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"GAFM Δ selection on {subsets(selection)}, ratio = leakAUC "
          f"({', '.join(args.attacks)}) / trainAUC, seed {cfg.run.seed}")
    print(f"{'delta':>7} {'mean ratio':>11} {'leakAUC':>8} {'trainAUC':>9}")
    for delta, ratio in selection.mean_ratio.items():
        rows = [t for t in selection.trials if t.delta == delta]
        print(f"{delta:>7.2f} {ratio:>11.3f} {np.mean([t.leak_auc for t in rows]):>8.3f} "
              f"{np.mean([t.train_auc for t in rows]):>9.3f}")
    print(f"selected delta = {selection.best_delta}")
    if args.json is not None:
        args.json.write_text(json.dumps(selection.to_dict(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="splitleak gafm-select", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
