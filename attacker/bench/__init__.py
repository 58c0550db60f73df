"""Benchmarks of the offline analysis (attacker bench): the leak metrics, model completion, EXACT."""

from __future__ import annotations

import argparse

from splitleak.cli_common import BadInput

# The synthetic log's bounds: the largest, 10 M rows of d = 128, is about 5 GiB of gradients.
MAX_ROWS, MAX_DIM, MAX_BATCH = 10_000_000, 8192, 65_536

# What each mode of `attacker bench` reads, with its defaults; a flag it does not read is refused.
READS = {"analysis": {"rows": 1_000_000, "dim": 128, "batch_size": 1024},
         "completion": {"steps": 2000},
         "exact": {"rows": 8192, "dim": 128, "batch_size": 1024, "vocab": 16}}


def bench_mode(args: argparse.Namespace) -> str:
    """The mode `attacker bench` runs, its flags' defaults filled in; BadInput (exit 2) for a flag
    the mode does not read."""
    if args.exact and args.completion:
        raise BadInput("attacker bench: --exact and --completion are two benchmarks; give one")
    mode = "exact" if args.exact else "completion" if args.completion else "analysis"
    reads = READS[mode]
    unread = [f"--{n.replace('_', '-')}" for n in ("rows", "dim", "batch_size", "steps", "vocab")
              if getattr(args, n) is not None and n not in reads]
    if unread:
        which = f"attacker bench{'' if mode == 'analysis' else ' --' + mode}"
        raise BadInput(f"{which} does not read {', '.join(unread)}; it reads only "
                       f"{', '.join('--' + n.replace('_', '-') for n in reads)}")
    for name, value in reads.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return mode
