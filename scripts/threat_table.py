"""Model completion against every defense on mnist_5k (issue 10): examples/threat/ over seeds.

Runs each file of examples/threat (no defense, KD^k, Laplace, compression, DiscreteSGD, PPDL,
label DP; Marvell with its binary no-defense pair), with party 1 honest and with its malicious
optimizer, in process (the same math as a distributed run). Each run is analysed with model
completion twice: bottom fine-tuned, as Fu et al. do for images, with both baselines for the
no-defense files; and bottom frozen, which measures the label information in the trained bottom
itself. Clustering on the cut gradients is added (pooled accuracy; binary: the mean flip-
corrected leak AUC over batches, and norm too). Prints a markdown table of seed means with 95 %
t intervals, each defense's change against the no-defense file of the same seed. Results go to
OUTPUT/results.jsonl as they come; a (file, seed) already there is not run again, so an
interrupted table resumes.

    .venv/bin/python scripts/threat_table.py --output-dir /tmp/threat [--seeds 0 1 2] [--only none kdk]
"""

from __future__ import annotations

import argparse
import json
import math
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from attacker.analysis import analyze
from orchestration.reference import run_reference
from orchestration.sweep.overrides import apply
from splitleak.config import parse_config
from splitleak.rundir import create_run_dir

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "threat"
DEFENSES = ["none", "kdk", "laplace", "sparsify", "discrete_sgd", "ppdl", "label_dp",
            "none_binary", "marvell"]
COMPLETION = {"name": "model_completion", "labelled_per_class": 4}


def reference_of(name: str) -> str:
    """The no-defense file a defense is compared with (Marvell runs on the binary digits)."""
    active = name.endswith("-active")
    base = name.removesuffix("-active")
    ref = "none_binary" if base in ("none_binary", "marvell") else "none"
    return ref + ("-active" if active else "")


def measure(name: str, seed: int, output_dir: Path) -> dict[str, Any]:
    data = tomllib.loads((EXAMPLES / f"{name}.toml").read_text())
    binary = data["dataset"]["name"].endswith("_binary")
    attacks = [dict(COMPLETION, baselines=name == reference_of(name)),
               dict(COMPLETION, fine_tune_bottom=False, baselines=False),
               "clustering", *(["norm"] if binary else [])]
    for path, value in [("run.seed", seed), ("run.output_dir", str(output_dir / "runs")),
                        ("attacker.record_first_layer", False), ("attacker.attacks", attacks)]:
        data = apply(data, path, value)
    cfg = parse_config(data)
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    summary = analyze(run.root, [(a.name, a.params) for a in cfg.attacker.attacks])  # as `run` does
    evals = [json.loads(line) for line in run.metrics.read_text().splitlines() if '"eval"' in line]
    row: dict[str, Any] = {"file": name, "seed": seed, "run": str(run.root),
                           "utility": evals[-1]["test_auc" if binary else "test_accuracy"]}
    for entry in summary["leak"]:
        if entry["scope"] != "run" or entry["parties"] != [1]:
            continue
        if entry["layer"] == "bottom":
            figures = entry["completion"]
            key = "fine_tuned" if "fine_tune_bottom=False" not in entry["attack"] else "frozen"
            row[key] = {split: figures[split]["top1"] for split in ("train", "test")}
            for baseline, scores in figures.get("baselines", {}).items():
                row[baseline] = {split: scores[split]["top1"] for split in ("train", "test")}
        elif entry["layer"] == "cut":
            pooled = entry.get("pooled")
            row[entry["attack"]] = pooled["accuracy"] if pooled else entry["flipped"]["mean"]
    return row


def mean_ci(values: list[float]) -> str:
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return f"{v.mean():.3f}"
    half = stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return f"{v.mean():.3f} ± {half:.3f}"


def with_change(runs: dict[int, dict], ref: dict[int, dict] | None, get: Any, relative: bool) -> str:
    """Mean ± CI over seeds, then the mean per-seed change against `ref` (None: it is the reference)."""
    text = mean_ci([get(r) for r in runs.values()])
    paired = [s for s in runs if ref and s in ref]
    if not paired:
        return text
    changes = [(get(runs[s]) - get(ref[s])) / (get(ref[s]) if relative else 1) for s in paired]
    return text + (f" ({np.mean(changes):+.0%})" if relative else f" ({100 * np.mean(changes):+.1f} pt)")


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per file, utility and completion (mean ± 95 % CI over seeds) with the mean
    per-seed change against the file's no-defense reference, then the gradient attacks."""
    by_file: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        by_file[row["file"]][row["seed"]] = row
    head = ["file", "seeds", "test accuracy (AUC: binary)", "completion fine-tuned, train / test",
            "completion frozen, train / test", "clustering (binary: mean AUC)", "norm (mean AUC)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    names = [n for n in (d + suffix for suffix in ("", "-active") for d in DEFENSES) if n in by_file]
    for name in names:
        runs = by_file[name]
        ref = None if name == reference_of(name) else by_file.get(reference_of(name))
        cells = [name, str(len(runs)), with_change(runs, ref, lambda r: r["utility"], False)]
        for key in ("fine_tuned", "frozen"):
            cells.append(" / ".join(with_change(runs, ref, lambda r, k=key, s=split: r[k][s], True)
                                    for split in ("train", "test")))
        has_norm = all("norm" in r for r in runs.values())
        cells += [mean_ci([r["clustering"] for r in runs.values()]),
                  mean_ci([r["norm"] for r in runs.values()]) if has_norm else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| no-defense file | labelled-only head, train / test | random bottom, train / test |",
              "|---|---|---|"]
    for name in [n for n in names if n == reference_of(n)]:
        cells = [" / ".join(mean_ci([r[b][s] for r in by_file[name].values()]) for s in ("train", "test"))
                 if all(b in r for r in by_file[name].values()) else "–"
                 for b in ("labelled_only", "random_bottom")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", choices=DEFENSES, help="these defenses (and their "
                        "no-defense reference)")
    args = parser.parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    results = args.output_dir / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    done = {(r["file"], r["seed"]) for r in rows}
    chosen = DEFENSES if not args.only else [d for d in DEFENSES if d in args.only or any(
        reference_of(o) == d for o in args.only)]
    for seed in args.seeds:
        for name in [d + suffix for suffix in ("", "-active") for d in chosen]:
            if (name, seed) in done:
                continue
            row = measure(name, seed, args.output_dir)
            rows.append(row)
            with results.open("a") as out:
                out.write(json.dumps(row) + "\n")
            print(f"{name} seed {seed}: utility {row['utility']:.4f}", flush=True)
    print("\n" + table(rows), flush=True)


if __name__ == "__main__":
    main()
