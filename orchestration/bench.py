"""`splitleak bench`: distributed vs in-process steps/s, and bytes on the wire vs raw tensors."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from orchestration import zygote_client
from orchestration.bench_budget import step_budget
from orchestration.bench_floor import round_trip_ms
from orchestration.bench_report import (
    GRAPHED,
    GRAPHED_IN_PROCESS,
    PLAINTEXT,
    print_bench,
    summarise_rounds,
)
from orchestration.bench_rounds import interleave
from orchestration.reference import run_reference
from orchestration.run import run_distributed
from splitleak.artifacts.metrics import read_metrics
from splitleak.artifacts.outcome import read_outcome
from splitleak.artifacts.paths import RunDir, timing_file
from splitleak.artifacts.rundir import create_run_dir
from splitleak.artifacts.summary import read_training_summary
from splitleak.artifacts.timing import read_timing_file
from splitleak.cli_common import BadInput
from splitleak.codec import WIRE_FLOATS
from splitleak.config import ConfigError, ExperimentConfig, load_config
from splitleak.placement import ATTACKER, check_devices, resolve_device, role_threads, roles
from splitleak.timing import WARMUP_STEPS


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


SETUPS = ("ctr", "cifar-resnet18")


def bench_config(steps: int, sidecar: bool = False, parties: int = 2, setup: str = "ctr",
                 device: str = "cpu", threads: int | str = "auto", tls: bool = True,
                 cuda_graphs: bool = False) -> ExperimentConfig:
    """`steps` train steps, all in the first epoch, and one evaluation at the end of a set-up
    (the default's data grows where `steps` would not fit its epoch); the sidecar records only
    if asked. "ctr": the default (synthetic CTR, batch 1024, cut width 128); "cifar-resnet18":
    Fu et al.'s CIFAR-10 split (ResNet-18 bottoms on 3×32×16 image strips of seeded random
    images, their 4-layer top, batch 32, momentum SGD), the label party holding no features.
    `parties`: that many passive parties, the columns split evenly (each keeping its width).
    `tls`: False for plaintext channels (the default, like a run's, is mutual TLS);
    `cuda_graphs`: the parties replay their train steps as CUDA graphs (run.cuda_graphs)."""
    data = load_config(None).model_dump()
    if setup == "cifar-resnet18":
        batch = 32
        rows = batch * steps + 10 * batch  # every train step a fresh batch, one eval pass
        data.update(
            dataset={"name": "synthetic_images", "params": {"rows": rows}, "test_fraction":
                     min(0.5, 10 * batch / rows)},
            model={"kind": "resnet", "depth": 18, "layers": [512, 256, 64]},
            objective={"name": "cross_entropy"}, defense=[])
        data["training"].update(batch_size=batch,
                                optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9})
        data["attacker"]["record_first_layer"] = False
    elif setup == "ctr":
        # every measured step in the first epoch: an evaluation pass (and the label party's
        # first import of scikit-learn) between train steps would count as their time
        train_share = 1.0 - data["dataset"]["test_fraction"]
        rows = math.ceil(data["training"]["batch_size"] * (steps + 1) / train_share)
        data["dataset"]["params"]["rows"] = max(data["dataset"]["params"]["rows"], rows)
    else:
        raise ValueError(f"bench set-up {setup!r}; allowed: {', '.join(SETUPS)}")
    data["run"].update(name="bench", device=device, torch_threads=threads, cuda_graphs=cuda_graphs)
    data["training"].update(max_steps=steps, eval_interval=0)
    data["attacker"]["enabled"] = sidecar
    data["topology"].update(passive_parties=parties, tls=tls)
    data["features"] = {"ratios": [1.0] * parties,
                        **({"label_party": data["features"]["label_party"]} if setup == "ctr" else {})}
    return ExperimentConfig.model_validate(data)


def steady_steps_per_second(records: Iterable[dict[str, Any]]) -> float:
    """Train steps per second over steps WARMUP_STEPS..last (the first WARMUP_STEPS dropped), the
    steps timing.json's spans cover: from the wall stamp ending step WARMUP_STEPS - 1 to the last."""
    walls = {r["step"]: r["wall"] for r in records if r["type"] == "train"}
    last = max(walls, default=-1)
    if last <= WARMUP_STEPS or WARMUP_STEPS - 1 not in walls:
        raise ValueError("too few steps to measure; raise --steps")
    return (last - WARMUP_STEPS + 1) / (walls[last] - walls[WARMUP_STEPS - 1])


def raw_tensor_bytes(records: list[dict[str, Any]], outcome: dict[str, Any]) -> int:
    """The tensors the run's train steps moved, as raw bytes: per party and row, a float32
    activation, a float32 cut gradient and an int64 sample id (the evaluation's not counted)."""
    rows = sum(r["batch_size"] for r in records if r["type"] == "train")
    return sum(rows * (2 * math.prod(shape) * 4 + 8) for shape in outcome["embedding_shapes"].values())


def step_message_bytes(cfg: ExperimentConfig, run: RunDir) -> int:
    """Bytes of the widest party's train activation (and of its cut gradient) on the wire."""
    width = max(math.prod(shape) for shape in read_outcome(run)["embedding_shapes"].values())
    return cfg.training.batch_size * width * WIRE_FLOATS[cfg.wire.dtype].itemsize


def _relayed(cfg: ExperimentConfig, base: Path) -> dict[str, float]:
    """One distributed run through byte-counting relays: its train steps, the raw bytes of their
    tensors, and all its protobuf and socket bytes (evaluation and handshakes included)."""
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
    outcome = read_outcome(relayed)
    records = list(read_metrics(relayed.metrics))
    return {"steps": sum(1 for r in records if r["type"] == "train"),
            "raw": raw_tensor_bytes(records, outcome),
            "protobuf": outcome["bytes_sent"] + outcome["bytes_received"],
            "wire": sum(r.upstream + r.downstream for r in relays)}


def per_train_step(long: dict[str, float], short: dict[str, float]) -> dict[str, float]:
    """Bytes per train step from two relayed runs that differ only in their train steps: the
    evaluation and the handshakes, the same in both, cancel out of the difference."""
    steps = long["steps"] - short["steps"]
    if steps <= 0:
        raise ValueError("the longer relayed run has no more train steps than the shorter")
    raw, payload, wire = ((long[k] - short[k]) / steps for k in ("raw", "protobuf", "wire"))
    return {"raw_bytes_per_step": raw, "protobuf_bytes_per_step": payload,
            "wire_bytes_per_step": wire, "wire_over_raw": wire / raw}


def _wire_figures(cfg: ExperimentConfig, base: Path) -> dict[str, float]:
    """Bytes per train step: raw tensors, protobuf messages, and on the socket (two runs, of
    max_steps and of half as many, on the same data)."""
    short = cfg.model_dump()
    assert cfg.training.max_steps is not None  # bench_config sets it
    short["training"]["max_steps"] = max(1, cfg.training.max_steps // 2)
    return per_train_step(_relayed(cfg, base), _relayed(ExperimentConfig.model_validate(short), base))


def distributed_threads(cfg: ExperimentConfig) -> int:
    """Intra-op threads of every party process of a distributed run together."""
    return sum(role_threads(cfg, role) for role in roles(cfg) if role != ATTACKER)


def in_process_threads(args: argparse.Namespace, cfg: ExperimentConfig) -> int:
    """The threaded in-process baseline's threads: --threads, else the distributed run's."""
    return args.threads or distributed_threads(cfg)


def bench_header(args: argparse.Namespace, rounds: int) -> str:
    """What the bench will run, the in-process baselines' threads as they will be."""
    threads = in_process_threads(args, bench_config(args.steps, setup=args.setup,
                                                    device=args.device))
    given = args.threads is not None
    baseline = ("1 thread" if threads == 1 else
                f"1 thread and {threads} threads, "
                + ("--threads" if given else "as many as the distributed run has"))
    scaled = ((", plaintext" if args.plaintext else "")
              + (", in-process and distributed with CUDA graphs" if args.cuda_graphs else "")
              + "".join(f", N={n}" for n in args.parties)
              + (f" (in-process on 1 and {threads} threads there too)"
                 if args.parties and given and threads != 1 else ""))
    return (f"splitleak bench ({args.setup} on {args.device}): {rounds} interleaved round(s) of "
            f"in-process ({baseline}), distributed, distributed+sidecar{scaled}")


def bench_variants(args: argparse.Namespace, base: Path,
                   console: Console) -> dict[str, Callable[[], dict[str, Any]]]:
    """Each measured variant: a fresh run (distributed or in-process) giving its steady steps/s
    and, when distributed, its step budget per role, its time to the first train step and the
    GPU memory each process held."""
    def variant(label: str, config: ExperimentConfig, distributed: bool) -> Callable[[], dict]:
        def measure() -> dict[str, Any]:
            console.print(f"  {label}: {args.steps} train steps ...")
            run = create_run_dir(config, base, "-bench")
            began = time.perf_counter()
            (run_distributed if distributed else run_reference)(config, run)
            steps_per_s = steady_steps_per_second(read_metrics(run.metrics))
            figures: dict[str, Any] = {"steps_per_s": steps_per_s,
                                       "wall_s": time.perf_counter() - began}
            if distributed:
                figures["budget"] = step_budget(run, config.topology.passive_parties,
                                                figures["steps_per_s"])
                summary = read_training_summary(run)
                figures["first_step_s"] = summary.get("time_to_first_step_s")
                figures["startup_s"] = summary.get("startup_s")
                figures["gpu_mib"] = gpu_memory(run, config.topology.passive_parties)
                figures["budget"]["wire_floor"] = round_trip_ms(step_message_bytes(config, run),
                                                                config.topology.tls)
            shutil.rmtree(run.root, ignore_errors=True)  # rounds x variants runs add up
            return figures
        return measure

    def config(**changes: Any) -> ExperimentConfig:
        return bench_config(args.steps, setup=args.setup, device=args.device, **changes)

    cfg = config()
    threads = args.threads = in_process_threads(args, cfg)
    variants = {"in-process": variant("in-process, 1 thread", config(threads=1), False)}
    if threads != 1:  # --threads 1: the 1-thread baseline already
        variants[f"in-process {threads} threads"] = variant(f"in-process, {threads} threads",
                                                            config(threads=threads), False)
    variants.update({"distributed": variant("distributed", cfg, True),
                     "distributed+sidecar": variant("distributed+sidecar", config(sidecar=True),
                                                    True)})
    if args.plaintext:
        variants[PLAINTEXT] = variant(PLAINTEXT, config(tls=False), True)
    if args.cuda_graphs:
        variants[GRAPHED_IN_PROCESS] = variant("in-process, 1 thread, CUDA graphs",
                                               config(threads=1, cuda_graphs=True), False)
        variants[GRAPHED] = variant(GRAPHED, config(cuda_graphs=True), True)
    for n in args.parties or []:
        scaled = config(parties=n)
        variants[f"in-process N={n}"] = variant(f"in-process N={n}, 1 thread",
                                                config(parties=n, threads=1), False)
        t = in_process_threads(args, scaled)
        if t != 1:
            variants[f"in-process N={n}, {t} threads"] = variant(
                f"in-process N={n}, {t} threads", config(parties=n, threads=t), False)
        variants[f"distributed N={n}"] = variant(f"distributed N={n}", scaled, True)
    return variants


def gpu_memory(run: RunDir, parties: int) -> dict[str, float]:
    """The most GPU memory (MiB) each process of the run held ({} on the CPU)."""
    roles = {"label party": run.label_party,
             **{f"passive party {k}": run.passive_party(k) for k in range(1, parties + 1)}}
    held = {name: read_timing_file(timing_file(folder)).get("gpu_max_reserved_mib")
            for name, folder in roles.items()}
    return {name: mib for name, mib in held.items() if mib is not None}


DEFAULT_ROUNDS = 5


def bench_rounds(args: argparse.Namespace) -> int:
    """The interleaved rounds asked for: --rounds, or 1 with --quick (exit 2 given both)."""
    if args.quick and args.rounds is not None:
        raise BadInput(f"splitleak bench --quick --rounds {args.rounds}: --quick is one round; "
                       "give --quick or --rounds N, not both")
    return 1 if args.quick else args.rounds or DEFAULT_ROUNDS


def run_bench(args: argparse.Namespace, console: Console) -> int:
    from label_party.defenses.bench_marvell import SHAPES, time_marvell

    rounds_wanted = bench_rounds(args)
    try:
        check_devices(bench_config(args.steps, setup=args.setup, device=args.device))
    except ConfigError as err:
        raise BadInput(f"splitleak bench --device {args.device}: {err}") from None
    device = resolve_device(args.device)
    if args.cuda_graphs and device.type != "cuda":
        raise BadInput(f"splitleak bench --cuda-graphs: the parties would compute on {device}; "
                       "CUDA graphs need a CUDA device (--device cuda)")
    parties = sorted(set(args.parties or []))
    args.parties = parties
    console.print(bench_header(args, rounds_wanted))
    if args.setup == "cifar-resnet18" and device.type == "cpu":
        console.print("[yellow]warning:[/] --setup cifar-resnet18 is sized for a GPU (ResNet-18 "
                      "bottoms); on the CPU each of its runs takes seconds a step, minutes a "
                      "round: give --device cuda where there is one, or --steps 10 --quick")

    done: list[dict[str, Any]] = []

    def announce(record: dict[str, Any]) -> None:
        console.print(f"round {record['round'] + 1}/{rounds_wanted} done, 1-minute load "
                      f"{record['load_start']:.2f} -> {record['load_end']:.2f}")
        done.append(record)
        if args.json is not None:  # the rounds so far survive an interrupted bench
            args.json.write_text(json.dumps({"partial": True, "rounds": done}, indent=2))

    zygote_client.warm_up(wait=zygote_client.READY_TIMEOUT)  # its imports not in round 1
    with tempfile.TemporaryDirectory(prefix="splitleak-bench-") as tmp:
        base = Path(tmp)
        rounds = interleave(bench_variants(args, base, console), rounds_wanted, announce)
        console.print("distributed through a byte-counting relay ...")
        wire = _wire_figures(bench_config(args.steps, setup=args.setup, device=args.device), base)
    torch.set_num_threads(1)
    marvell = ({shape: time_marvell(*shape, repeats=30)[0] for shape in SHAPES}
               if args.setup == "ctr" else {})
    result = summarise_rounds(rounds, parties, args.busy_load)
    result.update(wire, steps=args.steps, setup=args.setup, device=args.device,
                  threads=args.threads,
                  marvell_ms={f"{b}x{d}": ms for (b, d), ms in marvell.items()},
                  gpu_mib={name: held for name, v in rounds[-1]["variants"].items()
                           if (held := v.get("gpu_mib"))})
    print_bench(result, console)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
        console.print(f"every round: {args.json}")
    else:
        console.print_json(json.dumps(result))
    return 0
