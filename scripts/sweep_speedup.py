"""The local sweep engine's speed-up over running the same points one by one.

Runs a sweep file with `--jobs 1` and with `--jobs N` in fresh output directories, interleaved
(1, N, N, 1, 1, N, ...: each round flips the order so a load change lands on both sides), and
prints each round's wall times, the 1-minute load average around it, and the median and range
of the per-round speed-up t(jobs 1) / t(jobs N). `--json FILE` keeps every round.

    python scripts/sweep_speedup.py examples/sweeps/speedup.toml --jobs 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_sweep(file: Path, jobs: int, out: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "orchestration", "sweep", str(file), "--jobs",
                           str(jobs), "--output-dir", str(out), "--no-progress", "--no-compare"],
                          stdout=subprocess.DEVNULL)
    if done.returncode != 0:  # a failed point would make the comparison meaningless
        raise SystemExit(f"the sweep with --jobs {jobs} exited with {done.returncode} (its "
                         f"errors are above; the points' logs are under {out})")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="sweep-speedup-") as scratch:
        for r in range(args.rounds):
            order = (1, args.jobs) if r % 2 == 0 else (args.jobs, 1)
            load_before = os.getloadavg()[0]
            seconds = {jobs: timed_sweep(args.file, jobs, Path(scratch) / f"r{r}-j{jobs}") for jobs in order}
            row = {"round": r, "order": list(order), "seconds_jobs_1": seconds[1],
                   f"seconds_jobs_{args.jobs}": seconds[args.jobs],
                   "speedup": seconds[1] / seconds[args.jobs],
                   "load_before": load_before, "load_after": os.getloadavg()[0]}
            rounds.append(row)
            print(f"round {r}: jobs 1 {seconds[1]:.1f} s, jobs {args.jobs} {seconds[args.jobs]:.1f} s, "
                  f"speed-up {row['speedup']:.2f}x (load {load_before:.1f} -> {row['load_after']:.1f})",
                  flush=True)
    ups = [r["speedup"] for r in rounds]
    print(f"speed-up of --jobs {args.jobs} over --jobs 1: median {statistics.median(ups):.2f}x "
          f"(min {min(ups):.2f}x, max {max(ups):.2f}x) over {len(ups)} interleaved rounds")
    if args.json:
        report = {"file": str(args.file), "jobs": args.jobs, "rounds": rounds}
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
