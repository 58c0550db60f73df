"""VFLAIR's T-DCS per attack family and C-DCS per defense from a finished vflair_mnist sweep, read
from each run's leak summary (every entry names its attack's family and VFLAIR AP) until
`splitleak compare` groups attacks by family itself.

Usage: python examples/vflair/tdcs.py SWEEP_DIR   (e.g. sweeps/vflair_mnist)
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

from splitleak import Run, open_sweep
from splitleak.artifacts.sweep import read_index_rows

FAMILIES = {"label_inference": "LI", "feature_reconstruction": "FR", "targeted_backdoor": "TB",
            "non_targeted": "NTB"}


def dcs(ap: float, mp: float, mp_star: float, beta: float = 0.5) -> float:
    """VFLAIR's Defense Capability Score (src/metrics/data_process.py: cal_dcs), AP* = 0."""
    return 1 / (1 + math.sqrt((1 - beta) * max(ap, 0.0) ** 2 + beta * max(mp_star - mp, 0.0) ** 2))


def scenario(overrides: dict) -> str:
    party = (overrides.get("threat") or {}).get("parties", {}).get("1", {})
    return "backdoor" if "backdoor" in party else "missing" if "missing_features" in party else "clean"


def final_accuracy(run: Run) -> float:
    evals = run.metrics[run.metrics["type"] == "eval"]
    return float(evals["test_accuracy"].iloc[-1])


def main(sweep_dir: Path) -> None:
    sweep = open_sweep(sweep_dir)
    runs = {(row.variant, scenario(row.overrides_dict())): Run(sweep.dir.point(row.run_dir))
            for row in read_index_rows(sweep_dir) if row.status == "done"}
    mp_star = final_accuracy(runs[("none", "clean")])
    per_attack: dict[str, dict[str, tuple[str, float, float, float]]] = defaultdict(dict)
    for (defense, _), run in sorted(runs.items()):
        mp = final_accuracy(run)
        for e in run.summary.leak:
            ap = (e.get("ap") or {}).get("value")
            if e.scope != "run" or not e.get("vflair") or ap is None or e.layer == "first":
                continue  # VFLAIR's attacks only, scored at the cut layer
            per_attack[defense][e.get("vflair")] = (FAMILIES[e.get("family")], ap, mp,
                                                    dcs(ap, mp, mp_star))
    print(f"MP* (no defense, clean scenario): {mp_star:.4f}\n")
    print("| defense | " + " | ".join(f"T-DCS {f}" for f in FAMILIES.values()) + " | C-DCS |")
    print("|---|" + "---|" * (len(FAMILIES) + 1))
    for defense, attacks in per_attack.items():
        by_family = defaultdict(list)
        for family, _, _, score in attacks.values():
            by_family[family].append(score)
        t = [sum(v) / len(v) if (v := by_family.get(f)) else None for f in FAMILIES.values()]
        present = [x for x in t if x is not None]
        print(f"| {defense} | " + " | ".join("-" if x is None else f"{x:.4f}" for x in t)
              + f" | {sum(present) / len(present):.4f} |")
    print("\n| defense | attack (family) | AP | MP | DCS |\n|---|---|---|---|---|")
    for defense, attacks in per_attack.items():
        for name, (family, ap, mp, score) in sorted(attacks.items(), key=lambda a: a[1][0]):
            print(f"| {defense} | {name} ({family}) | {ap:.4f} | {mp:.4f} | {score:.4f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
