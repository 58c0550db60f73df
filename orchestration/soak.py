"""`splitleak soak`: hostile messages against every RPC of live services, then a long run of
many parties; prints crashes, hangs, status-code counts and RSS growth (issue 13, item 7).

The hostile messages come from a seeded numpy generator: random bytes, mutations of valid
messages, valid messages with hostile field values. tests/test_fuzz.py drives the same
senders with hypothesis for a bounded number of cases.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from rich.console import Console
from rich.table import Table

from label_party.driver import Progress
from label_party.server import LabelPartyRun
from label_party.servicer import LabelPartyServicer
from label_party.session import Session
from label_party.setup import load_label_party_data
from orchestration.processes import Child, spawn, stop_all
from passive_party.client import load_bottom
from splitleak.artifacts.metrics import MetricsWriter
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.records import read_pids
from splitleak.artifacts.rundir import create_run_dir
from splitleak.codec import decode_ids, encode_ids, encode_tensor
from splitleak.config import PROTOCOL_VERSION, ExperimentConfig, parse_config
from splitleak.transport import PARTY_ID_KEY, SESSION_KEY, bind, create_server
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc
from splitleak.v1 import tensor_pb2
from splitleak.validation import resolved
from splitleak.wire import add_service

# A status that means the service failed, not the peer: never allowed as an answer.
FORBIDDEN = frozenset({"UNKNOWN", "INTERNAL", "HANG", "UNAVAILABLE", "CANCELLED", "DATA_LOSS"})
HANG = "HANG"  # the client's deadline fired: the service did not answer in time
ERRORS_COLUMN = "/".join(sorted(FORBIDDEN - {HANG}))  # the report's column of forbidden answers
RAW = {"request_serializer": None, "response_deserializer": None}
_SIZES = (-1, 0, 1, 2, 3, 8, 16, 31, 2**31, 2**40, 2**62)


# --- hostile messages -----------------------------------------------------------------------


def _pick(rng: np.random.Generator, values: Any) -> Any:
    """One of `values`, kept as the Python object it is (numpy would round huge ints)."""
    return values[int(rng.integers(len(values)))]


def hostile_tensor(rng: np.random.Generator, valid: tensor_pb2.Tensor | None = None) -> tensor_pb2.Tensor:
    """A Tensor with a random dtype, shape and byte length (sometimes consistent ones)."""
    if valid is not None and rng.random() < 0.3:
        tensor = tensor_pb2.Tensor()
        tensor.CopyFrom(valid)
        data = bytearray(tensor.data)
        for i in rng.integers(0, max(1, len(data)), size=min(len(data), 4)):
            data[i] = 0xFF  # NaN / Inf patterns in float32, huge ids in int64
        tensor.data = bytes(data)
        return tensor
    dims = [int(_pick(rng, _SIZES)) for _ in range(int(rng.integers(0, 4)))]
    size = int(np.prod([max(d, 0) for d in dims])) * 4 if all(0 <= d < 64 for d in dims) else 0
    length = size if rng.random() < 0.5 else int(rng.integers(0, 512))
    return tensor_pb2.Tensor(dtype=int(rng.integers(0, 12)),  # type: ignore[arg-type]  # any code: fuzzing
                             shape=dims,
                             data=rng.bytes(length))


def mutated(rng: np.random.Generator, data: bytes) -> bytes:
    """Bytes of a valid message, damaged: flipped bytes, cut short, or garbage spliced in."""
    buffer = bytearray(data)
    kind = rng.integers(0, 3)
    if kind == 0 and buffer:
        for i in rng.integers(0, len(buffer), size=int(rng.integers(1, 8))):
            buffer[i] = int(rng.integers(0, 256))
    elif kind == 1:
        buffer = buffer[: int(rng.integers(0, len(buffer) + 1))]
    else:
        at = int(rng.integers(0, len(buffer) + 1))
        buffer[at:at] = rng.bytes(int(rng.integers(1, 64)))
    return bytes(buffer)


def _one_of(rng: np.random.Generator, valid: bytes, hostile: Callable[[], Any]) -> bytes:
    choice = rng.integers(0, 3)
    if choice == 0:
        return rng.bytes(int(rng.integers(0, 256)))
    if choice == 1:
        return mutated(rng, valid)
    return hostile().SerializeToString()


def join_payloads(rng: np.random.Generator, valid: pb.JoinRequest, count: int) -> Iterator[bytes]:
    def hostile() -> pb.JoinRequest:
        request = pb.JoinRequest()
        request.CopyFrom(valid)
        field_ = rng.integers(0, 5)
        if field_ == 0:
            request.protocol_version = int(rng.integers(0, 2**32))
        elif field_ == 1:
            request.party_id = int(_pick(rng, [0, 2, 65, 2**32 - 1]))
        elif field_ == 2:
            request.embedding_shape[:] = [int(_pick(rng, _SIZES)) for _ in range(rng.integers(0, 5))]
        elif field_ == 3:
            request.config_hash = "h" * int(_pick(rng, [0, 15, 17, 100_000]))
        else:
            request.num_rows = int(rng.integers(0, 2**63))
        return request

    for _ in range(count):
        yield _one_of(rng, valid.SerializeToString(), hostile)


def record_payloads(rng: np.random.Generator, valid: apb.GradientRecord,
                    count: int) -> Iterator[list[bytes]]:
    def hostile() -> apb.GradientRecord:
        record = apb.GradientRecord()
        record.CopyFrom(valid)
        for _ in range(int(rng.integers(1, 3))):
            field_ = rng.integers(0, 7)
            if field_ == 0:
                record.run_id = _pick(rng, ["", "other", "r" * 100_000])
            elif field_ == 1:
                record.party_id = int(_pick(rng, [0, 1, 2, 2**32 - 1]))
            elif field_ == 2:
                record.epoch = int(_pick(rng, [0, 2**31 - 1, 2**31, 2**32 - 1]))
            elif field_ == 3:
                record.step = int(_pick(rng, [0, 2**63 - 1, 2**63, 2**64 - 1]))
            elif field_ == 4:
                record.sample_ids.CopyFrom(hostile_tensor(rng, valid.sample_ids))
            elif field_ == 5:
                record.cut_gradient.CopyFrom(hostile_tensor(rng, valid.cut_gradient))
            else:
                record.first_layer_gradient.CopyFrom(hostile_tensor(rng))
        return record

    for _ in range(count):
        yield [_one_of(rng, valid.SerializeToString(), hostile)
               for _ in range(int(rng.integers(1, 4)))]


def party_payloads(rng: np.random.Generator, valid: pb.PartyMessage,
                   count: int) -> Iterator[list[bytes]]:
    def hostile() -> pb.PartyMessage:
        message = pb.PartyMessage()
        message.CopyFrom(valid)
        field_ = rng.integers(0, 5)
        if field_ == 0:
            message.phase = int(rng.integers(0, 8))  # type: ignore[assignment]  # any value: fuzzing
        elif field_ == 1:
            message.step = int(_pick(rng, [1, 2**63, 2**64 - 1]))
        elif field_ == 2:
            message.activation.CopyFrom(hostile_tensor(rng, valid.activation))
        elif field_ == 3:
            message.checkpoint.step = int(rng.integers(0, 2**63))
            message.checkpoint.sha256 = "0" * int(_pick(rng, [0, 64, 10_000]))
        else:
            message.failure.message = "x" * int(_pick(rng, [0, 10, 100_000]))
        return message

    for _ in range(count):
        yield [_one_of(rng, valid.SerializeToString(), hostile)
               for _ in range(int(rng.integers(1, 4)))]


# --- senders --------------------------------------------------------------------------------


# The client could not send because the service had already ended the call (grpc-python then
# reports INTERNAL on the client's side and never shows the service's own status).
ENDED_WHILE_WRITING = "ENDED_WHILE_WRITING"


def _code(err: grpc.aio.AioRpcError) -> str:
    if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "Deadline Exceeded" == err.details():
        return HANG  # gRPC's own words: the client gave up, the service never answered
    if err.code() == grpc.StatusCode.INTERNAL and "SendMessageOperation" in (
            err.debug_error_string() or ""):
        return ENDED_WHILE_WRITING
    return err.code().name


async def send_join(channel: grpc.aio.Channel, payload: bytes, timeout: float) -> str:
    try:
        await channel.unary_unary("/splitleak.v1.LabelParty/Join", **RAW)(payload, timeout=timeout)
    except grpc.aio.AioRpcError as err:
        return _code(err)
    return "OK"


async def send_record(channel: grpc.aio.Channel, messages: list[bytes], timeout: float) -> str:
    call = channel.stream_unary("/splitleak.v1.AttackerSidecar/Record", **RAW)
    try:
        await call(iter(messages), timeout=timeout)
    except grpc.aio.AioRpcError as err:
        return _code(err)
    return "OK"


async def send_unadmitted(channel: grpc.aio.Channel, metadata: tuple, messages: list[bytes],
                          timeout: float) -> str:
    """A Train stream that was never admitted (no or a forged session)."""
    call = channel.stream_stream("/splitleak.v1.LabelParty/Train", **RAW)(
        metadata=metadata, timeout=timeout)
    try:
        for message in messages:
            await call.write(message)
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError as err:
        return _code(err)
    except asyncio.InvalidStateError:
        pass  # the service ended the call while we wrote: its status says why
    return _code_of(await call.code(), await call.details())


def _code_of(code: grpc.StatusCode, details: str) -> str:
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and details == "Deadline Exceeded":
        return HANG
    return code.name


class SessionRig:
    """One label party server whose session is renewed for every case: a hostile message in
    an admitted Train stream ends its run, so each case gets a run of its own."""

    def __init__(self, cfg: ExperimentConfig, workdir: Path) -> None:
        self.cfg = cfg = resolved(cfg)
        self.data = load_label_party_data(cfg)
        self.run = RunDir(workdir)
        self.bottom = load_bottom(cfg, 1)
        self.servicer: LabelPartyServicer | None = None
        self.server: grpc.aio.Server | None = None
        self.address = ""

    async def start(self) -> None:
        self.servicer = LabelPartyServicer(Session(self.cfg, self.data, "soak"))
        self.server = create_server(self.cfg.topology)
        add_service(self.server, pb_grpc.add_LabelPartyServicer_to_server, self.servicer,
                    self.cfg.topology.max_message_mb)
        self.address = f"127.0.0.1:{bind(self.server, '127.0.0.1:0')}"
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)

    def valid_answer(self, batch: pb.Batch) -> pb.PartyMessage:
        ids = decode_ids(batch.sample_ids, field="ids")
        activation = self.bottom.forward(ids, batch.phase == pb.TRAIN)
        return pb.PartyMessage(phase=batch.phase, step=batch.step,
                               activation=encode_tensor(activation))

    async def case(self, channel: grpc.aio.Channel, messages: Callable[[pb.PartyMessage], list[bytes]],
                   timeout: float) -> str:
        """Join honestly, then answer the first batch with `messages(valid answer)`."""
        assert self.servicer is not None
        session = self.servicer.session = Session(self.cfg, self.data, "soak")
        writer = MetricsWriter(self.run.metrics)
        labelled = LabelPartyRun(self.cfg, self.run, session, self.data, writer, Progress())
        outcome = asyncio.ensure_future(labelled.until_done(handle_signals=False))
        call = None
        try:
            stub = pb_grpc.LabelPartyStub(channel)
            request = pb.JoinRequest(protocol_version=PROTOCOL_VERSION, party_id=1,
                                     embedding_shape=self.bottom.embedding_shape,
                                     config_hash=self.cfg.hash, num_rows=self.bottom.inputs.num_rows)
            plan = await stub.Join(request, timeout=timeout)
            call = channel.stream_stream("/splitleak.v1.LabelParty/Train", **RAW)(
                metadata=((PARTY_ID_KEY, "1"), (SESSION_KEY, plan.session)), timeout=timeout)
            asked = pb.LabelPartyMessage.FromString(await call.read())
            for message in messages(self.valid_answer(asked.next_batch)):
                await call.write(message)
                reply = await call.read()  # the next batch: that message was accepted
                if reply is grpc.aio.EOF:
                    break
            return "OK"
        except grpc.aio.AioRpcError as err:
            return _code(err)
        except asyncio.InvalidStateError:
            assert call is not None
            return _code_of(await call.code(), await call.details())
        finally:
            if call is not None:
                call.cancel()
            if not outcome.done():
                labelled.interrupt()
                labelled.interrupt()
            try:
                await asyncio.wait_for(outcome, timeout)
            except (TimeoutError, asyncio.CancelledError):
                pass
            writer.close()


# --- the soak ------------------------------------------------------------------------------


@dataclass
class Tally:
    rpc: str
    counts: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    rss: list[tuple[int, float]] = field(default_factory=list)  # (% of the cases, MiB) at each quarter

    @property
    def messages(self) -> int:
        return sum(self.counts.values())

    @property
    def hangs(self) -> int:
        return self.counts[HANG]

    @property
    def errors(self) -> int:
        """Answers with a forbidden status code (hangs, counted apart, not among them)."""
        return sum(n for code, n in self.counts.items() if code in FORBIDDEN - {HANG})

    @property
    def failures(self) -> int:
        return sum(n for code, n in self.counts.items() if code in FORBIDDEN)


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def fuzz_config(root: Path, limit_mb: int = 1) -> ExperimentConfig:
    """One passive party on breast_cancer, deadlines that never end a case, no checkpoints."""
    return parse_config({
        "run": {"name": "soak", "seed": 0, "output_dir": str(root)},
        "dataset": {"name": "breast_cancer", "test_fraction": 0.25},
        "features": {"passive": [[0, 30]]},
        "model": {"kind": "mlp", "layers": [16, 8], "cut_layer": 1},
        "training": {"batch_size": 32, "epochs": 1, "checkpoint_every": 0},
        "topology": {"passive_parties": 1, "step_deadline_s": 30, "join_deadline_s": 3600,
                     "max_message_mb": limit_mb, "tls": False},
    })


def _wait_for(path: Path, child: Child, timeout: float = 120) -> str:
    end = time.monotonic() + timeout
    while not path.exists():
        if child.returncode is not None or time.monotonic() > end:
            raise RuntimeError(f"{child.name} did not start: {child.log_tail()}")
        time.sleep(0.05)
    return path.read_text().strip()


async def _fuzz(address: str, tally: Tally, payloads: Iterator[Any], send: Callable[..., Any],
                timeout: float, pid: int | None, cases: int) -> None:
    """Send every case, counting its status; `pid`: the live service whose RSS to sample at each
    quarter (None: the service runs in this process, its RSS not the service's alone)."""
    started = time.monotonic()
    # the case after which each quarter is done (fewer than 4 cases: the last quarter each ends)
    quarters = {max(1, round(k * cases / 4)): 25 * k for k in range(1, 5)} if pid else {}
    if pid is not None:
        tally.rss.append((0, rss_mb(pid) or 0.0))
    async with grpc.aio.insecure_channel(address) as channel:
        for i, payload in enumerate(payloads, 1):
            tally.counts[await send(channel, payload, timeout)] += 1
            if pid is not None and i in quarters:
                tally.rss.append((quarters[i], rss_mb(pid) or 0.0))
    tally.seconds = time.monotonic() - started


def fuzz_services(messages: int, seed: int, workdir: Path, console: Console) -> dict[str, Any]:
    """Join, Record and unadmitted Train against live server processes; admitted Train
    against a server in this process (a fresh run per case)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = fuzz_config(workdir)
    run = create_run_dir(cfg, workdir)
    rng = np.random.default_rng(seed)
    timeout = 60.0  # a service that has not answered by then hangs (generous: a loaded host)
    label = spawn("label party", ["label_party", "serve", "--config", str(run.config), "--run-dir",
                                  str(run.root), "--port-file", str(workdir / "label.address"),
                                  "--listen", "127.0.0.1:0"], run.logs / "label_party.log")
    # Observing party 1's tap and what the label party receives from party 1 (a stream no
    # case completes cleanly): a clean stream of party 1's tap does not end the sidecar's run,
    # as it would not while a real run's other stream goes on.
    sidecar = spawn("attacker sidecar", ["attacker", "serve", "--listen", "127.0.0.1:0", "--out",
                                         str(workdir / "sidecar"), "--config", str(run.config),
                                         "--party", "1", "--receive", "1", "--run-id", "r1",
                                         "--port-file", str(workdir / "sidecar.address")],
                    run.logs / "attacker.log")
    children = [label, sidecar]
    tallies = {name: Tally(name) for name in ("Join", "Train (not admitted)", "Record",
                                              "Train (admitted)")}
    memory: dict[str, tuple[float | None, float | None]] = {}
    try:
        label_address = _wait_for(workdir / "label.address", label)
        sidecar_address = _wait_for(workdir / "sidecar.address", sidecar)
        bottom = load_bottom(cfg, 1)
        join = pb.JoinRequest(protocol_version=PROTOCOL_VERSION, party_id=1,
                              embedding_shape=bottom.embedding_shape, config_hash=cfg.hash,
                              num_rows=bottom.inputs.num_rows)
        record = apb.GradientRecord(run_id="r1", party_id=1, epoch=0, step=0, config_hash=cfg.hash,
                                    sample_ids=encode_ids(np.arange(32, dtype=np.int64)),
                                    cut_gradient=encode_tensor(np.ones((32, 16), np.float32)))
        answer = pb.PartyMessage(phase=pb.TRAIN, step=0, activation=encode_tensor(
            np.ones((32, 16), np.float32)))
        before = {c.name: rss_mb(c.process.pid) for c in children}

        def unadmitted() -> Iterator[tuple]:
            for messages_ in party_payloads(rng, answer, messages):
                party = _pick(rng, ["1", "0", "99", "9" * 5000, "x", ""])
                metadata = ((PARTY_ID_KEY, party), (SESSION_KEY, rng.bytes(8).hex()))
                yield metadata, messages_

        label_pid, sidecar_pid = label.process.pid, sidecar.process.pid

        async def everything() -> None:
            await _fuzz(label_address, tallies["Join"], join_payloads(rng, join, messages),
                        send_join, timeout, label_pid, messages)
            await _fuzz(label_address, tallies["Train (not admitted)"], unadmitted(),
                        lambda ch, case, t: send_unadmitted(ch, case[0], case[1], t), timeout,
                        label_pid, messages)
            await _fuzz(sidecar_address, tallies["Record"], record_payloads(rng, record, messages),
                        send_record, timeout, sidecar_pid, messages)
            rig = SessionRig(cfg, workdir / "sessions")
            await rig.start()
            try:
                cases = (lambda valid, r=rng: next(party_payloads(r, valid, 1))
                         for _ in range(messages))
                await _fuzz(rig.address, tallies["Train (admitted)"], cases,
                            lambda ch, make, t: rig.case(ch, make, t), timeout, None, messages)
            finally:
                await rig.stop()

        console.print(f"fuzzing Join, Train and Record: {messages} cases each ...")
        asyncio.run(everything())
        after = {c.name: rss_mb(c.process.pid) for c in children}
        memory = {name: (before[name], after[name]) for name in before}
        crashed = [f"{c.name} ({c.how_it_ended()})" for c in children if c.returncode is not None]
    finally:
        stop_all(children)
    return {"tallies": tallies, "memory": memory, "crashed": crashed}


def long_run(parties: int, steps: int, workdir: Path, console: Console) -> dict[str, Any]:
    """N passive parties for `steps` train steps; RSS of every process over the run."""
    from orchestration.run import run_distributed

    cfg = parse_config({
        "run": {"name": f"soak-{parties}", "seed": 0, "output_dir": str(workdir)},
        "dataset": {"name": "breast_cancer", "test_fraction": 0.25},
        "features": {"ratios": [1] * parties},
        "model": {"kind": "mlp", "layers": [8, 8], "cut_layer": 1},
        "training": {"batch_size": 8, "epochs": steps // 54 + 1, "max_steps": steps,
                     "eval_interval": max(1, steps // 10), "checkpoint_every": max(1, steps // 10)},
        "topology": {"passive_parties": parties, "tls": False},
        "attacker": {"attacks": ["norm"]},
    })
    workdir.mkdir(parents=True, exist_ok=True)
    run = create_run_dir(cfg, workdir)
    samples: dict[str, list[tuple[int, float]]] = {}
    result: dict[str, Any] = {}

    def train() -> None:
        try:
            result["outcome"] = run_distributed(cfg, run)
        except Exception as err:  # noqa: BLE001 - reported, not raised: the soak prints it
            result["error"] = str(err)

    console.print(f"a run of {parties} passive parties for {steps} train steps ...")
    thread = threading.Thread(target=train)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)  # a short run is over in seconds: sample often enough to see every role
        pids = read_pids(run)
        if pids is None:
            continue
        done = _steps_done(run)
        for name, pid in pids.items():
            mb = rss_mb(pid)
            if mb is not None:
                samples.setdefault(name, []).append((done, mb))
    return {"run": run, "error": result.get("error"), "growth": rss_growth(samples, steps),
            "steps": _steps_done(run)}


def rss_growth(samples: dict[str, list[tuple[int, float]]],
               steps: int) -> dict[str, tuple[float, float]]:
    """Each process's (first, last) RSS in MiB from `samples` of (train steps done, MiB) taken
    once the run has settled: after a tenth of its steps, and never before its first step (a
    process still importing its libraries has not grown; it has not started). A process with
    no such sample (the run ended first, or failed before training) has no figure."""
    floor = max(1, steps // 10)
    growth = {}
    for name, points in samples.items():
        settled = [mb for done, mb in points if done >= floor]
        if settled:
            growth[name] = (settled[0], settled[-1])
    return growth


def _steps_done(run: RunDir) -> int:
    from splitleak.artifacts.metrics import MetricsTail

    records = MetricsTail(run.metrics).read_new()
    return sum(1 for r in records if r.get("type") == "train")


def print_report(console: Console, fuzz: dict[str, Any] | None, run: dict[str, Any] | None) -> int:
    failed = False
    if fuzz is not None:
        table = Table(title="hostile messages against live services")
        for column in ("RPC", "cases", "hangs", ERRORS_COLUMN, "seconds"):
            table.add_column(column, justify="right")
        for tally in fuzz["tallies"].values():
            table.add_row(tally.rpc, str(tally.messages), str(tally.hangs),
                          str(tally.errors), f"{tally.seconds:.0f}")
            failed |= tally.failures > 0
        console.print(table)
        for tally in fuzz["tallies"].values():
            codes = ", ".join(f"{code} {n}" for code, n in tally.counts.most_common())
            console.print(f"{tally.rpc}: {codes}", soft_wrap=True)
            if tally.rss:  # a live service's (not the admitted Train's, in this process)
                console.print("  service RSS (MiB) after " + ", ".join(
                    f"{percent} %: {mb:.0f}" for percent, mb in tally.rss) + " of the cases",
                    soft_wrap=True)
        for name, (before, after) in fuzz["memory"].items():
            console.print(f"{name}: RSS {before:.0f} MiB -> {after:.0f} MiB "
                          f"({after - before:+.1f} MiB)" if before and after else f"{name}: gone")
        console.print(f"crashes: {len(fuzz['crashed'])} {fuzz['crashed'] or ''}")
        failed |= bool(fuzz["crashed"])
    if run is not None:
        console.print(f"long run: {run['steps']} train steps; "
                      f"{'ok' if run['error'] is None else 'FAILED: ' + run['error']}")
        for name, (first, last) in sorted(run["growth"].items()):
            console.print(f"  {name}: RSS {first:.0f} -> {last:.0f} MiB ({last - first:+.1f} MiB)")
        if not run["growth"]:
            console.print("  RSS growth: no process was sampled after the run's first train step")
        failed |= run["error"] is not None
    return 1 if failed else 0


def run_soak(args: argparse.Namespace, console: Console) -> int:
    for role in ("label_party", "attacker", "passive_party"):  # refusals are the point here
        logging.getLogger(role).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="splitleak-soak-") as tmp:
        workdir = Path(tmp)
        fuzz = None if args.skip_fuzz else fuzz_services(args.messages, args.seed, workdir / "fuzz",
                                                          console)
        run = None if args.skip_run else long_run(args.parties, args.steps, workdir / "run", console)
        return print_report(console, fuzz, run)
