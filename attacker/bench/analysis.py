"""`attacker bench`: the offline analysis on a synthetic gradient log of N rows, on one core."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from attacker.bench.attacks import synthetic_batch
from attacker.sidecar.store import GradientStore
from splitleak.artifacts.paths import RunDir

ONE_CORE = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def write_synthetic_run(root: Path, rows: int, dim: int, batch_size: int, seed: int = 0) -> RunDir:
    """A run directory with a gradient log of `rows` rows and the matching label export."""
    run = RunDir(root)
    root.mkdir(parents=True, exist_ok=True)
    run.config.write_text(f"# synthetic benchmark log\n[run]\nseed = {seed}\n")
    rng = np.random.default_rng(seed)
    store = GradientStore(run.gradients, "bench")
    labels = np.empty(rows, dtype=np.int64)
    for step, start in enumerate(range(0, rows, batch_size)):
        size = min(batch_size, rows - start)
        gradients, y = synthetic_batch(rng, size, dim, positive_rate=0.25)
        ids = np.arange(start, start + size, dtype=np.int64)
        labels[ids] = y
        store.append(1, 0, step, ids, {"cut_gradient": gradients})
    store.close()
    run.labels.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"sample_id": np.arange(rows), "label": labels}), run.labels)
    return run


def _analyse_in_child(run: RunDir) -> dict:
    """Time `analyze` in a fresh one-core process; its peak RSS is the analysis's alone."""
    code = ("import json, sys, time; from attacker.analysis.analyze import analyze; t = time.process_time();"
            " w = time.perf_counter(); s = analyze(sys.argv[1]);"
            " print(json.dumps({'cpu': time.process_time() - t, 'wall': time.perf_counter() - w,"
            " 'entries': len(s['leak'])}))")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = subprocess.run([sys.executable, "-c", code, str(run.root)], capture_output=True,
                            text=True, env={**os.environ, **ONE_CORE}, check=True)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["peak_rss_mib"] = max(peak_kib, before) / 1024
    return figures


def run_bench(args: argparse.Namespace, console: Console) -> int:
    with tempfile.TemporaryDirectory(prefix="splitleak-attacker-bench-") as tmp:
        started = time.perf_counter()
        run = write_synthetic_run(Path(tmp) / "run", args.rows, args.dim, args.batch_size)
        written = time.perf_counter() - started
        log_mib = sum(p.stat().st_size for p in run.attacker.rglob("*")) / 2**20
        figures = _analyse_in_child(run)
    table = Table(title=f"attacker bench: {args.rows:,} gradient rows, d = {args.dim}, "
                        f"batches of {args.batch_size}, every default binary attack, one core")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("log written (s)", f"{written:.1f}")
    table.add_row("log size (MiB)", f"{log_mib:.0f}")
    table.add_row("[bold]analysis CPU time (s)[/] (aim <= 20)", f"[bold]{figures['cpu']:.1f}")
    table.add_row("analysis wall time (s)", f"{figures['wall']:.1f}")
    table.add_row("rows per CPU second", f"{args.rows / figures['cpu']:,.0f}")
    table.add_row("[bold]analysis peak RSS (MiB)[/] (aim <= 1024)",
                  f"[bold]{figures['peak_rss_mib']:.0f}")
    console.print(table)
    console.print_json(json.dumps({"rows": args.rows, "dim": args.dim, **figures,
                                   "log_mib": log_mib}))
    return 0
