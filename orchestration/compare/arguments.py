"""The options of `splitleak compare` (light: the CLI builds its parser without importing torch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from splitleak.arguments import MAX_PARTIES, float_in, int_in, writable_dir

# where a leak is measured (summary.json's `layer`): gradient layers, the activations the party
# sent (attacker.record_activation), model completion on its bottom, reconstruction of its inputs
LAYERS = ("cut", "first", "activation", "bottom", "input")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", type=Path, nargs="+", metavar="SWEEP_DIR|RUN_DIR",
                        help="a sweep directory (its finished points), run directories, or a "
                        "directory of run directories")
    parser.add_argument("--output-dir", type=writable_dir,
                        help="where compare/ goes (default: SWEEP_DIR/compare for one sweep "
                        "directory, else ./compare)")
    parser.add_argument("--leak-stat", choices=("flipped_p95", "flipped_mean"), default="flipped_p95",
                        help="the AUC statistic of the plots and the Pareto frontier (default: "
                        "flipped_p95, the p95 over batches, Li et al.'s headline)")
    parser.add_argument("--layer", default="cut", choices=LAYERS,
                        help="where the leak is measured: cut or first (gradient layers), "
                             "activation (what the party sent, e.g. clustering on it), bottom "
                             "(model completion), or input (feature reconstruction from received "
                             "activations); default cut")
    parser.add_argument("--party", type=int_in(1, MAX_PARTIES),
                        help="observed passive party (default: the lowest)")
    parser.add_argument("--dcs-ap", choices=("vflair", "auc"), default="vflair",
                        help="the attack performance DCS, T-DCS and C-DCS are computed from: vflair "
                        "(default; VFLAIR's: a score attack's threshold-rule accuracy, a label "
                        "attack's accuracy) or auc (score attacks by the mean flip-corrected leak "
                        "AUC, splitleak's earlier DCS)")
    parser.add_argument("--max-utility-cost", type=float_in(0.0, 1.0), default=0.01, metavar="C",
                        help="the verdicts' budget: the lowest-leak setting on the Pareto frontier "
                        "whose utility drop against no defense is at most C (default 0.01: 0.01 "
                        "test AUC, or 1 point of test accuracy)")
    parser.add_argument("--target-utility", type=float_in(0.0, 1.0), metavar="U",
                        help="the utility 'time to target' is measured to (default: the lowest "
                        "final utility of any compared run, which every run reached)")
