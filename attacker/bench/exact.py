"""`attacker bench --exact`: EXACT's candidate gradients per CPU second on one core."""

from __future__ import annotations

import argparse
import json
import time

import torch
from rich.console import Console
from rich.table import Table

from attacker.attacks.exact.exact import Candidates, reconstruct
from splitleak.config import ModelConfig
from splitleak.models import InputSpec, build_top


def batch_rows(rows: int, batch_size: int) -> list[int]:
    """The batches that make up exactly `rows` examples: full ones, then the rest."""
    return [batch_size] * (rows // batch_size) + ([rows % batch_size] if rows % batch_size else [])


def run_exact_bench(args: argparse.Namespace, console: Console) -> int:
    """Time `reconstruct` on `--rows` random examples in batches of `--batch-size`: a top of the
    example's shape, `--vocab` values in each of two private fields, cut width `--dim`; one
    intra-op thread, CPU time."""
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    cards = [args.vocab, args.vocab]
    model = ModelConfig(kind="mlp", layers=[args.dim, 16], cut_layer=1, embedding_dim=4)
    top = build_top(model, [(args.dim,)], InputSpec(0, tuple(cards)), outputs=1, seed=0)
    candidates = Candidates.enumerate(cards, (0, 1), labels=2)
    batches = batch_rows(args.rows, args.batch_size)
    started = time.process_time()
    wall = time.perf_counter()
    for rows in batches:
        h = torch.randn(rows, args.dim, generator=generator)
        gradients = torch.randn(rows, args.dim, generator=generator) * 1e-3
        categorical = torch.randint(0, args.vocab, (rows, 2), generator=generator)
        reconstruct(top, h, gradients, torch.zeros(rows, 0), categorical, candidates)
    cpu = time.process_time() - started
    wall = time.perf_counter() - wall
    total = args.rows * candidates.count
    table = Table(title=f"attacker bench --exact: {args.rows:,} examples × {candidates.count:,} "
                        f"candidates (2 private fields of {args.vocab} values × 2 labels), d = "
                        f"{args.dim}, one thread")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("candidate gradients", f"{total:,}")
    table.add_row("CPU time (s)", f"{cpu:.2f}")
    table.add_row("wall time (s)", f"{wall:.2f}")
    table.add_row("[bold]candidate gradients per second per core[/]", f"[bold]{total / cpu:,.0f}")
    console.print(table)
    console.print_json(json.dumps({"candidates": total, "cpu": cpu, "wall": wall,
                                   "per_cpu_second": total / cpu}))
    return 0
