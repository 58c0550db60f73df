"""Measure the other benchmarks' defenses (issue 12): utility and leak, two strengths each.

Runs, one after another and in process (the same math as a distributed run), the built-in
default (binary) and examples/digits_no_top.toml (10 classes, no top model) with no defense and
with each of grad_perturb, mid, dcor, pe_loss and cae at two strengths, analyses every run with
the attacks that apply (on party 1's cut-layer gradients, and clustering also on the
activations it sent), and prints two markdown tables. Accuracy and leak figures, not speed:
machine load does not change them.

    .venv/bin/python scripts/benchmark_plugins_table.py --output-dir /tmp/table [--only binary]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from attacker.analysis import analyze, metric_stats
from orchestration.reference import run_reference
from splitleak.config import load_config, parse_config
from splitleak.rundir import create_run_dir

REPO = Path(__file__).resolve().parents[1]
BINARY_ATTACKS = [("norm", {}), ("cosine_oracle", {}), ("mean", {"centers": "oracle"}),
                  ("clustering", {})]
MULTICLASS_ATTACKS = [("direct_label", {}), ("clustering", {}), ("batch_label_counts", {})]

# (label, objective or None, defense chain) per setting; two strengths per defense.
SETTINGS: dict[str, list[tuple[str, dict | None, list]]] = {
    "binary": [
        ("no defense", None, []),
        ("grad_perturb ε=10", None, [{"name": "grad_perturb", "epsilon": 10.0}]),
        ("grad_perturb ε=1", None, [{"name": "grad_perturb", "epsilon": 1.0}]),
        ("mid λ=0.01", {"name": "mid", "lambda": 0.01}, []),
        ("mid λ=1", {"name": "mid", "lambda": 1.0}, []),
        ("dcor α=0.5", {"name": "dcor", "alpha": 0.5}, []),
        ("dcor α=2", {"name": "dcor", "alpha": 2.0}, []),
        ("pe_loss α=1", {"name": "pe_loss", "alpha": 1.0}, []),
        ("pe_loss α=10", {"name": "pe_loss", "alpha": 10.0}, []),
        ("cae λ=0.5", {"name": "cae", "lambda": 0.5}, []),
        ("cae λ=2", {"name": "cae", "lambda": 2.0}, []),
    ],
    "multiclass": [
        ("no defense", None, []),
        ("grad_perturb ε=10", None, [{"name": "grad_perturb", "epsilon": 10.0}]),
        ("grad_perturb ε=1", None, [{"name": "grad_perturb", "epsilon": 1.0}]),
        ("mid λ=0.1", {"name": "mid", "lambda": 0.1}, []),
        ("mid λ=1", {"name": "mid", "lambda": 1.0}, []),
        ("dcor α=0.5", {"name": "dcor", "alpha": 0.5}, []),
        ("dcor α=2", {"name": "dcor", "alpha": 2.0}, []),
        ("pe_loss α=1", {"name": "pe_loss", "alpha": 1.0}, []),
        ("pe_loss α=3", {"name": "pe_loss", "alpha": 3.0}, []),  # α=10: accuracy 0.21
        ("cae λ=0.5", {"name": "cae", "lambda": 0.5}, []),
        ("cae λ=2", {"name": "cae", "lambda": 2.0}, []),
    ],
}
BASES = {"binary": None, "multiclass": REPO / "examples" / "digits_no_top.toml"}


def measure(task: str, label: str, objective: dict | None, chain: list,
            output_dir: Path) -> dict[str, Any]:
    data = load_config(BASES[task]).model_dump(mode="json")
    data["objective"] = objective or {"name": "cross_entropy"}
    data["defense"] = chain
    data["run"] = dict(data["run"], output_dir=str(output_dir / task))
    data["attacker"] = dict(data["attacker"], record_activation=True)  # forward-embedding attack
    cfg = parse_config(data)
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    attacks = BINARY_ATTACKS if task == "binary" else MULTICLASS_ATTACKS
    summary = analyze(run.root, attacks)
    leak = {e["attack"] + ("" if e["layer"] == "cut" else " on activations"): metric_stats(e)
            for e in summary["leak"] if e["scope"] == "run" and e["party_id"] == 1
            and e["layer"] in ("cut", "activation")}
    evals = [json.loads(line) for line in run.metrics.read_text().splitlines() if '"eval"' in line]
    metric = "test_auc" if task == "binary" else "test_accuracy"
    return {"task": task, "setting": label, "utility": evals[-1][metric], "leak": leak,
            "run": str(run.root)}


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: utility (Δ against no defense), then each attack's mean (p95) over batches."""
    base = rows[0]["utility"]
    attacks = list(rows[0]["leak"])
    binary = rows[0]["task"] == "binary"
    head = ["setting", "test AUC" if binary else "test accuracy", *attacks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        delta = "" if row is rows[0] else f" ({row['utility'] - base:+.3f})"
        cells = [f"{row['leak'][a]['mean']:.3f} ({row['leak'][a]['p95']:.3f})" for a in attacks]
        lines.append("| " + " | ".join([row["setting"], f"{row['utility']:.3f}{delta}", *cells]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--only", choices=sorted(SETTINGS))
    args = parser.parse_args()
    results = args.output_dir / "results.jsonl"
    for task, settings in SETTINGS.items():
        if args.only and task != args.only:
            continue
        rows = []
        for label, objective, chain in settings:
            row = measure(task, label, objective, chain, args.output_dir)
            rows.append(row)
            with results.open("a") as out:
                out.write(json.dumps(row) + "\n")
            print(f"{task} {label}: {row['utility']:.4f}", flush=True)
        print(f"\n{task}\n\n{table(rows)}\n", flush=True)


if __name__ == "__main__":
    main()
