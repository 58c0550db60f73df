"""GAFM's Δ selection (Appendix D.3): train on random 10 % subsets, keep the Δ with the lowest
mean leakAUC/trainAUC.

For each repeat r a random subset (without replacement) of `fraction` of the run's train rows,
and the same fraction of its test rows, is drawn from `rng(seed, "gafm_select", r)`; GAFM is
trained on it in process (the same trainer, bottoms and step loop as `orchestration.reference`) once
per Δ with everything else as configured. Within a repeat every Δ sees the same subset and the
same initialisation (a paired comparison); repeats differ in both.

- leakAUC: mean over the batches of the flip-corrected per-batch leak AUC max(AUC, 1 − AUC) at
  the cut layer, averaged over the observed parties and over `attacks` (default: the norm attack
  alone; the paper averages the ratio over norm, mean and median attacks: pass
  `attacks=("norm", "mean", "median")` — mean and median use oracle class centers, as GAFM
  evaluates them). Single-class batches are skipped, as in the report.
- trainAUC: ROC AUC of the trained model's prediction on the subset's train rows.
- ratio = leakAUC / trainAUC per (Δ, repeat); the selected Δ has the lowest mean ratio over the
  repeats (ties: the smaller Δ).

Entry points: `select_delta(cfg, ...)` and `main(argv)` (`python -m
orchestration.gafm_select CONFIG`); `add_arguments(parser)` + `run_cli(args)` wire it
as a subcommand. Like `orchestration.reference` this composes every role in one process (bottoms,
label party, attacker analysis), so those imports happen inside the functions that need them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from splitleak.config import ConfigError, ExperimentConfig
from splitleak.seeding import derive_seed, rng

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


def _with_delta(cfg: ExperimentConfig, delta: float, seed: int) -> ExperimentConfig:
    data = cfg.model_dump(mode="json")
    data["objective"] = {**cfg.objective.params, "name": cfg.objective.name, "delta": delta}
    data["run"]["seed"] = seed
    data["attacker"]["enabled"] = True
    return ExperimentConfig.model_validate(data)


def _subset(ids: np.ndarray, fraction: float, generator: np.random.Generator) -> np.ndarray:
    size = max(2, int(round(fraction * ids.size)))
    return np.sort(generator.choice(ids, size=min(size, ids.size), replace=False))


def _trial(cfg: ExperimentConfig, train_ids: np.ndarray, test_ids: np.ndarray, root: Path,
           attacks: Sequence[str]) -> tuple[float, float, float | None]:
    """Train GAFM on the given rows in process; returns (leakAUC, trainAUC, test AUC)."""
    from attacker.analysis import analyze
    from attacker.store import GradientStore
    from label_party.driver import drive
    from label_party.outputs import write_labels
    from label_party.schedule import make_plan, schedule
    from label_party.setup import load_label_party_data
    from label_party.trainer import LabelPartyTrainer
    from orchestration.reference import LocalExchange
    from passive_party.bottom_trainer import BottomTrainer
    from splitleak.datasets import build_dataset
    from splitleak.inputs import load_party_inputs
    from splitleak.partition import passive_columns
    from splitleak.rundir import create_run_dir

    run = create_run_dir(cfg, root)
    dataset = build_dataset(cfg.dataset.name, cfg.dataset.params)
    data = load_label_party_data(cfg, dataset)
    data = dataclasses.replace(data, train_ids=train_ids, test_ids=test_ids,
                               plan=make_plan(cfg, train_ids.size))
    width = cfg.output_width(data.num_classes)
    bottoms = {k: BottomTrainer(cfg, k, load_party_inputs(cfg, dataset, cols), width)
               for k, cols in passive_columns(cfg, data.schema).items()}
    observe = set(cfg.threat.curious)
    store = GradientStore(run.attacker / "gradients", run.root.name)
    trainer = LabelPartyTrainer(cfg, data.labels, data.num_classes,
                                {k: b.embedding_shape for k, b in bottoms.items()}, data.own_inputs,
                                data.train_ids)
    records: list[dict[str, Any]] = []
    batches = schedule(data.plan, data.train_ids, data.test_ids, cfg.run.seed)
    asyncio.run(drive(trainer, batches, LocalExchange(bottoms, store, observe), records.append))
    store.close()
    write_labels(run, data)
    summary = analyze(run.root, [ATTACK_SPECS[a] for a in attacks])
    labels = {ATTACK_SPECS[a][0] for a in attacks}
    leaks = [e["flipped"]["mean"] for e in summary["leak"]
             if e["scope"] == "run" and e["layer"] == "cut" and e["attack"].split("(")[0] in labels
             and e.get("flipped") and e["flipped"]["mean"] is not None]
    if not leaks:
        raise ValueError(f"no batch with both classes in the {train_ids.size}-row subset: raise "
                         "the fraction or the batch size")
    with torch.no_grad():
        activations = [bottoms[k].forward(train_ids, False) for k in sorted(bottoms)]
        own = (data.own_inputs.rows(torch.from_numpy(train_ids)) if data.own_inputs is not None
               else (None, None))
        scores = trainer.objective.predict(activations, own)[:, 0].numpy()
    y = data.labels[train_ids]
    train_auc = float(roc_auc_score(y, scores)) if len(np.unique(y)) == 2 else float("nan")
    evals = [r for r in records if r.get("type") == "eval"]
    return float(np.mean(leaks)), train_auc, (evals[-1].get("test_auc") if evals else None)


def select_delta(cfg: ExperimentConfig, *, deltas: Sequence[float] = DELTAS, fraction: float = 0.1,
                 repeats: int = 5, attacks: Sequence[str] = ("norm",),
                 output_dir: Path | None = None) -> DeltaSelection:
    """Run the selection; trial run directories go under `output_dir` (a temporary one if None)."""
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
    from label_party.setup import load_label_party_data

    data = load_label_party_data(cfg)
    trials: list[DeltaTrial] = []
    with tempfile.TemporaryDirectory(prefix="gafm-select-") as scratch:
        root = Path(output_dir) if output_dir is not None else Path(scratch)
        for repeat in range(repeats):
            draw = rng(cfg.run.seed, "gafm_select", repeat)
            train_ids = _subset(data.train_ids, fraction, draw)
            test_ids = _subset(data.test_ids, fraction, draw)
            seed = derive_seed(cfg.run.seed, "gafm_select", "run", repeat) % 2**31
            for delta in deltas:
                leak, train_auc, test_auc = _trial(_with_delta(cfg, delta, seed), train_ids,
                                                   test_ids, root, attacks)
                trials.append(DeltaTrial(float(delta), repeat, seed, int(train_ids.size), leak,
                                         train_auc, test_auc))
    mean_ratio = {float(d): float(np.mean([t.ratio for t in trials if t.delta == d]))
                  for d in deltas}
    best = min(sorted(mean_ratio), key=lambda d: mean_ratio[d])
    return DeltaSelection(best, mean_ratio, trials, fraction, repeats, tuple(attacks), cfg.run.seed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="experiment TOML with objective.name = 'gafm'")
    parser.add_argument("--deltas", type=float, nargs="+", default=list(DELTAS),
                        help="candidate Δ values (default: %(default)s)")
    parser.add_argument("--fraction", type=float, default=0.1,
                        help="share of the train (and test) rows per subset (default: 0.1)")
    parser.add_argument("--repeats", type=int, default=5, help="random subsets (default: 5)")
    parser.add_argument("--attacks", nargs="+", default=["norm"], choices=sorted(ATTACK_SPECS),
                        help="attacks whose leak AUCs are averaged (default: norm)")
    parser.add_argument("--output-dir", type=Path, help="keep the trial run directories here")
    parser.add_argument("--json", type=Path, help="also write the selection as JSON here")


def run_cli(args: argparse.Namespace) -> int:
    from label_party.validate import check_chain
    from splitleak.cli_common import EXIT_BAD_INPUT, config_or_exit
    from splitleak.validation import check_core

    cfg = config_or_exit(args.config)
    try:
        check_core(cfg)
        check_chain(cfg)
        selection = select_delta(cfg, deltas=args.deltas, fraction=args.fraction,
                                 repeats=args.repeats, attacks=args.attacks,
                                 output_dir=args.output_dir)
    except ConfigError as err:
        print(f"invalid config {args.config}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"GAFM Δ selection on {args.repeats} random {args.fraction:.0%} subsets, "
          f"ratio = leakAUC ({', '.join(args.attacks)}) / trainAUC, seed {cfg.run.seed}")
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
    parser = argparse.ArgumentParser(prog="gafm-select", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
