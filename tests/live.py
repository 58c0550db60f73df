"""Live services on loopback inside the test's own event loop: a label party and a sidecar
exactly as their processes build them (real gRPC servers, real sockets), plus a scripted
passive party that can send anything."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from attacker.sidecar.servicer import AttackerServicer, add_sidecar
from attacker.sidecar.store import GradientStore
from label_party.server import Serving, start
from passive_party.bottom_trainer import BottomTrainer
from passive_party.client import load_bottom
from splitleak.artifacts.paths import RunDir
from splitleak.codec import decode_ids, encode_ids, encode_tensor
from splitleak.config import PROTOCOL_VERSION, ExperimentConfig, TopologyConfig
from splitleak.transport import PARTY_ID_KEY, SESSION_KEY, bind, create_server
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import attacker_pb2_grpc as apb_grpc
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc
from tests.conftest import scaled

RAW = {"request_serializer": None, "response_deserializer": None}  # bytes in, bytes out


@contextlib.asynccontextmanager
async def sidecar(root: Path, observe: frozenset[int] = frozenset({1}), run_id: str = "r1",
                  limit_mb: int = 64, resume: bool = False, receive: frozenset[int] = frozenset(),
                  shapes: dict | None = None,
                  config_hash: str | None = None) -> AsyncIterator[tuple[str, AttackerServicer]]:
    store = GradientStore(RunDir(root).attacker / "gradients", run_id, resume=resume)
    received = (GradientStore(RunDir(root).attacker / "received", run_id, resume=resume)
                if receive else None)
    servicer = AttackerServicer(store, set(observe), run_id, received=received, receive=set(receive),
                                shapes=shapes, config_hash=config_hash, max_message_mb=limit_mb)
    try:
        async with served(lambda server: add_sidecar(server, servicer, limit_mb),
                          limit_mb) as address:
            yield address, servicer
    finally:
        for each in servicer.stores.values():
            each.close()


@contextlib.asynccontextmanager
async def served(add: Callable[[grpc.aio.Server], None], limit_mb: int = 64) -> AsyncIterator[str]:
    """A plaintext gRPC server on a loopback port, its services added by `add`; its address."""
    server = create_server(TopologyConfig(tls=False, max_message_mb=limit_mb))
    add(server)
    port = bind(server, "127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def label_party(cfg: ExperimentConfig, root: Path) -> AsyncIterator[tuple[Serving, asyncio.Task]]:
    """A label party serving one run; the task ends with the run's outcome."""
    serving = await start(cfg, RunDir(root), "127.0.0.1:0")
    task = asyncio.ensure_future(serving.until_done())
    try:
        yield serving, task
    finally:
        if not task.done():
            serving.labelled.interrupt()  # before training: stop at once
            serving.labelled.interrupt()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, scaled(30))


def join_request(cfg: ExperimentConfig, bottom: BottomTrainer, **changes: Any) -> pb.JoinRequest:
    fields: dict[str, Any] = dict(protocol_version=PROTOCOL_VERSION, party_id=bottom.party_id,
                                  embedding_shape=bottom.embedding_shape, config_hash=cfg.hash,
                                  num_rows=bottom.inputs.num_rows)
    fields.update(changes)
    return pb.JoinRequest(**fields)


class ScriptedParty:
    """A passive party whose every message the test writes (honest ones via `answer`)."""

    def __init__(self, cfg: ExperimentConfig, channel: grpc.aio.Channel, party_id: int = 1) -> None:
        self.cfg = cfg
        self.stub = pb_grpc.LabelPartyStub(channel)
        self.bottom = load_bottom(cfg, party_id)
        self.call: Any = None
        self.plan: pb.TrainingPlan | None = None

    async def join(self) -> pb.TrainingPlan:
        self.plan = await self.stub.Join(join_request(self.cfg, self.bottom), timeout=scaled(10))
        return self.plan

    async def open(self) -> Any:
        assert self.plan is not None
        self.call = self.stub.Train(metadata=((PARTY_ID_KEY, str(self.bottom.party_id)),
                                              (SESSION_KEY, self.plan.session)))
        return self.call

    def activation(self, batch: pb.Batch) -> pb.PartyMessage:
        ids = decode_ids(batch.sample_ids, field="ids")
        act = self.bottom.forward(ids, batch.phase == pb.TRAIN)
        return pb.PartyMessage(phase=batch.phase, step=batch.step, activation=encode_tensor(act))

    async def status(self) -> grpc.aio.AioRpcError:
        """Read until the label party ends the call with an error; that error."""
        try:
            while True:
                message = await asyncio.wait_for(self.call.read(), scaled(30))
                if message is grpc.aio.EOF:
                    raise AssertionError("the stream ended without an error status")
        except grpc.aio.AioRpcError as err:
            return err


async def scripted_run(cfg: ExperimentConfig, root: Path,
                       script: Callable[[ScriptedParty], Awaitable[None]]
                       ) -> tuple[grpc.aio.AioRpcError, dict]:
    """Party 1 joins a live label party, opens its Train stream and plays `script`; the status
    its stream ends with, and the run's outcome."""
    async with label_party(cfg, root) as (serving, outcome):
        options = [("grpc.max_send_message_length", 64 << 20)]  # the client may send anything
        async with grpc.aio.insecure_channel(serving.address, options=options) as channel:
            party = ScriptedParty(cfg, channel)
            await party.join()
            await party.open()
            await script(party)
            return await party.status(), await asyncio.wait_for(outcome, scaled(30))


def gradient_record(party: int = 1, step: int = 0, rows: int = 4, width: int = 3,
                    run_id: str = "r1", epoch: int = 0) -> apb.GradientRecord:
    return apb.GradientRecord(run_id=run_id, party_id=party, epoch=epoch, step=step,
                              sample_ids=encode_ids(np.arange(rows, dtype=np.int64)),
                              cut_gradient=encode_tensor(np.ones((rows, width), np.float32)))


async def record_stream(address: str, records: list[Any], raw: bool = False) -> Any:
    """Send records (messages, or raw bytes with `raw`) on one Record call; its reply."""
    async with grpc.aio.insecure_channel(address) as channel:
        if raw:
            call = channel.stream_unary("/splitleak.v1.AttackerSidecar/Record", **RAW)
        else:
            call = apb_grpc.AttackerSidecarStub(channel).Record
        return await call(iter(records), timeout=scaled(20))


async def wait_for_train_step(run: RunDir, step: int, timeout: float = 60) -> None:
    from splitleak.artifacts.metrics import read_metrics

    end = asyncio.get_running_loop().time() + scaled(timeout)
    while asyncio.get_running_loop().time() < end:
        if run.metrics.exists() and any(r["type"] == "train" and r["step"] >= step
                                        for r in read_metrics(run.metrics)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"step {step} never came")


async def whole_run(cfg: ExperimentConfig, root: Path, resume: bool = False,
                    interrupt_at: int | None = None, parties_resume: bool | None = None
                    ) -> tuple[dict, list[BaseException | None]]:
    """Every party of a run in this event loop (each with its real server or client): the
    label party's outcome and each passive party's error (None if it finished).
    `parties_resume`: whether the passive parties were started with --resume (default: as
    the label party)."""
    from passive_party.client import run_party
    from splitleak.checkpoint import resume_point

    run = RunDir(root)
    manifest = resume_point(run.root, cfg) if resume else None
    observe, receive = frozenset(cfg.tapped_parties), frozenset(cfg.received_parties)
    async with contextlib.AsyncExitStack() as stack:
        tap_address = None
        if observe or receive:
            tap_address, _ = await stack.enter_async_context(
                sidecar(root, observe, run.root.name, cfg.topology.max_message_mb, resume, receive))
        serving = await start(cfg, run, "127.0.0.1:0", resuming=resume, manifest=manifest,
                              attacker=tap_address if receive else None)
        outcome = asyncio.ensure_future(serving.until_done())
        parties = [asyncio.ensure_future(run_party(
            cfg, k, serving.address, run, attacker=tap_address if k in observe else None,
            resuming=resume if parties_resume is None else parties_resume))
            for k in range(1, cfg.topology.passive_parties + 1)]
        if interrupt_at is not None:
            await wait_for_train_step(run, interrupt_at)
            serving.labelled.interrupt()
        ended = await asyncio.wait_for(outcome, scaled(120))
        errors = await asyncio.gather(*parties, return_exceptions=True)
    return ended, [e if isinstance(e, BaseException) else None for e in errors]
