"""VFLAIR's T-DCS per attack family and C-DCS per defense *across scenarios* from a finished
vflair_mnist sweep. `splitleak compare` gives the same T-DCS per setting (one defense in one
scenario) over the same attacks, VFLAIR's own (LeakEntry.in_vflair); this adds VFLAIR's last
step: one C-DCS per defense over its three scenarios, with VFLAIR's MP* (the clean scenario
without a defense) for every scenario, where compare pairs each scenario with its own run
without a defense.

Usage: python examples/vflair/tdcs.py SWEEP_DIR   (e.g. sweeps/vflair_mnist)
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from orchestration.compare.dcs import attack_performance, dcs
from orchestration.compare.entries import FAMILIES, leak_entries
from orchestration.compare.table import CAPABILITY_LAYERS
from splitleak import Run, open_sweep
from splitleak.artifacts.sweep import read_index_rows

SHORT = dict(zip(FAMILIES.values(), ("LI", "FR", "TB", "NTB"), strict=True))


def scenario(overrides: dict) -> str:
    party = (overrides.get("threat") or {}).get("parties", {}).get("1", {})
    return "backdoor" if "backdoor" in party else "missing" if "missing_features" in party else "clean"


def final_accuracy(run: Run) -> float:
    evals = run.metrics[run.metrics["type"] == "eval"]
    return float(evals["test_accuracy"].iloc[-1])


class NotReady(ValueError):
    """The directory is not a vflair_mnist sweep this table can be computed from."""


def main(sweep_dir: Path) -> None:
    sweep = open_sweep(sweep_dir)
    runs = {(row.variant, scenario(row.overrides_dict())): Run(sweep.dir.point(row.run_dir))
            for row in read_index_rows(sweep_dir) if row.status == "done"}
    if ("none", "clean") not in runs:
        raise NotReady(f"{sweep_dir} has no finished point of variant 'none' in the clean scenario, "
                       "whose accuracy is MP*: run (or finish) the sweep first, e.g. `splitleak sweep "
                       "examples/vflair/sweep.toml` (it resumes)")
    mp_star = final_accuracy(runs[("none", "clean")])
    per_attack: dict[str, dict[str, tuple[str, float, float, float]]] = defaultdict(dict)
    for (defense, _), run in sorted(runs.items()):
        mp = final_accuracy(run)
        for e in leak_entries(run.summary):
            ap = attack_performance(e)
            if not e.in_vflair or e.diagnostic or e.premise or ap is None \
                    or e.layer not in CAPABILITY_LAYERS:
                continue  # VFLAIR's attacks only, where compare's capability section scores them
            per_attack[defense][e.vflair] = (SHORT[e.attack_type], ap, mp, dcs(ap, mp, mp_star))
    print(f"MP* (no defense, clean scenario): {mp_star:.4f}\n")
    print("| defense | " + " | ".join(f"T-DCS {f}" for f in SHORT.values()) + " | C-DCS |")
    print("|---|" + "---|" * (len(SHORT) + 1))
    for defense, attacks in per_attack.items():
        by_family = defaultdict(list)
        for family, _, _, score in attacks.values():
            by_family[family].append(score)
        t = [sum(v) / len(v) if (v := by_family.get(f)) else None for f in SHORT.values()]
        present = [x for x in t if x is not None]
        print(f"| {defense} | " + " | ".join("-" if x is None else f"{x:.4f}" for x in t)
              + f" | {sum(present) / len(present):.4f} |")
    print("\n| defense | attack (family) | AP | MP | DCS |\n|---|---|---|---|---|")
    for defense, attacks in per_attack.items():
        for name, (family, ap, mp, score) in sorted(attacks.items(), key=lambda a: a[1][0]):
            print(f"| {defense} | {name} ({family}) | {ap:.4f} | {mp:.4f} | {score:.4f} |")


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python examples/vflair/tdcs.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="a vflair_mnist sweep directory, e.g. "
                        "sweeps/vflair_mnist")
    args = parser.parse_args(argv)
    try:
        main(args.sweep_dir)
    except ValueError as err:  # not a sweep directory, or no MP* point yet
        print(f"tdcs.py: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
