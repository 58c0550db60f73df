"""`splitleak bench`: distributed vs in-process steps/s, and bytes on the wire vs raw tensors."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from orchestration.reference import run_reference
from orchestration.run import run_distributed
from splitleak.config import ExperimentConfig, load_config
from splitleak.metrics_log import read_metrics
from splitleak.rundir import RunDir, create_run_dir


class ByteCountingRelay:
    """A loopback TCP relay in its own thread that counts every byte in both directions."""

    def __init__(self, target: str) -> None:
        self.target_host, port = target.rsplit(":", 1)
        self.target_port = int(port)
        self.upstream = 0  # passive parties -> label party
        self.downstream = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.address = ""

    def __enter__(self) -> ByteCountingRelay:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        await asyncio.gather(self._pipe(reader, up_writer, "upstream"),
                             self._pipe(up_reader, writer, "downstream"))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    direction: str) -> None:
        try:
            while chunk := await reader.read(1 << 16):
                setattr(self, direction, getattr(self, direction) + len(chunk))
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


def bench_config(steps: int, sidecar: bool = False) -> ExperimentConfig:
    """The default set-up (synthetic CTR, batch 1024, cut width 128, 2 passive parties),
    `steps` train steps, one evaluation at the end; the sidecar records only if asked."""
    cfg = load_config(None)
    return cfg.model_copy(update={
        "run": cfg.run.model_copy(update={"name": "bench"}),
        "training": cfg.training.model_copy(update={"max_steps": steps, "eval_interval": 0}),
        "attacker": cfg.attacker.model_copy(update={"enabled": sidecar}),
    })


def steady_steps_per_second(run: RunDir, warmup: int) -> float:
    """Train steps per second after `warmup` steps, from the driver's wall-clock stamps."""
    walls = [r["wall"] for r in read_metrics(run.metrics) if r["type"] == "train"]
    if len(walls) <= warmup + 1:
        raise ValueError("too few steps to measure; raise --steps")
    return (len(walls) - 1 - warmup) / (walls[-1] - walls[warmup])


def raw_tensor_bytes(run: RunDir, outcome: dict[str, Any]) -> int:
    """Every tensor the run moved, as raw bytes: per party and row, a float32 activation
    (train and eval), a float32 cut gradient (train) and an int64 sample id."""
    total = 0
    for shape in outcome["embedding_shapes"].values():
        width = 1
        for s in shape:
            width *= s
        for r in read_metrics(run.metrics):
            if r["type"] == "train":
                total += r["batch_size"] * (2 * width * 4 + 8)
            elif r["type"] == "eval":
                total += r["test_rows"] * (width * 4 + 8)
    return total


def run_bench(args: argparse.Namespace, console: Console) -> int:
    from label_party.defenses.bench_marvell import SHAPES, time_marvell

    cfg = bench_config(args.steps)
    warmup = max(5, args.steps // 10)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="splitleak-bench-") as tmp:
        base = Path(tmp)

        def measure(label: str, config: ExperimentConfig, distributed: bool) -> RunDir:
            console.print(f"{label}: {args.steps} train steps ...")
            run = create_run_dir(config, base, "-" + label.split()[0])
            if distributed:
                run_distributed(config, run)
            else:
                run_reference(config, run)
            results[label] = steady_steps_per_second(run, warmup)
            return run

        measure("in-process reference", cfg, distributed=False)
        measure("distributed", cfg, distributed=True)
        measure("distributed+sidecar", bench_config(args.steps, sidecar=True), distributed=True)
        console.print("distributed through a byte-counting relay ...")
        relayed = create_run_dir(cfg, base, "-relayed")
        relays: list[ByteCountingRelay] = []

        def route(address: str) -> str:
            relays.append(ByteCountingRelay(address).__enter__())
            return relays[-1].address

        try:
            run_distributed(cfg, relayed, route=route)
        finally:
            for relay in relays:
                relay.__exit__()
        outcome = json.loads(relayed.outcome.read_text())
        steps = sum(1 for r in read_metrics(relayed.metrics) if r["type"] == "train")
        raw = raw_tensor_bytes(relayed, outcome) / steps
        wire = sum(r.upstream + r.downstream for r in relays) / steps
        payload = (outcome["bytes_sent"] + outcome["bytes_received"]) / steps
    torch.set_num_threads(1)
    marvell = {shape: time_marvell(*shape, repeats=30)[0] for shape in SHAPES}
    step_ms = 1e3 / results["distributed"]
    table = Table(title=f"splitleak bench: default set-up, {args.steps} train steps "
                        "(batch 1024, cut width 128, 2 passive parties), measured in this run")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for label in ("in-process reference", "distributed", "distributed+sidecar"):
        table.add_row(f"{label}, train steps/s", f"{results[label]:.1f}")
    ratio = results["distributed"] / results["in-process reference"]
    sidecar_ratio = results["distributed+sidecar"] / results["distributed"]
    table.add_row("[bold]distributed / in-process[/] (aim >= 0.8)", f"[bold]{ratio:.2f}x")
    table.add_row("[bold]with sidecar / without[/] (aim >= 0.9)", f"[bold]{sidecar_ratio:.2f}x")
    table.add_row("raw tensor bytes per step", f"{raw:,.0f}")
    table.add_row("protobuf message bytes per step", f"{payload:,.0f}")
    table.add_row("socket bytes per step (gRPC over HTTP/2)", f"{wire:,.0f}")
    table.add_row("[bold]wire / raw[/] (aim <= 1.05)", f"[bold]{wire / raw:.4f}x")
    table.add_row("distributed train step (ms)", f"{step_ms:.1f}")
    for (batch, dim), ms in marvell.items():
        share = f" = {100 * ms / step_ms:.1f} % of the step" if (batch, dim) == (1024, 128) else ""
        table.add_row(f"marvell per batch, B={batch} d={dim} (ms)", f"{ms:.2f}{share}")
    console.print(table)
    console.print_json(json.dumps({
        "steps_per_s": results, "distributed_over_reference": ratio,
        "sidecar_over_plain": sidecar_ratio, "raw_bytes_per_step": raw,
        "protobuf_bytes_per_step": payload, "wire_bytes_per_step": wire,
        "wire_over_raw": wire / raw, "step_ms": step_ms,
        "marvell_ms": {f"{b}x{d}": ms for (b, d), ms in marvell.items()}}))
    return 0
