"""`passive-party run`: join the label party, then answer its Train stream until it says done."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any

import grpc
import numpy as np
import torch

from passive_party.bottom_trainer import BottomTrainer
from splitleak.codec import CodecError, decode_ids, decode_tensor, encode_tensor
from splitleak.config import PROTOCOL_VERSION, ExperimentConfig
from splitleak.datasets import build_dataset
from splitleak.inputs import load_party_inputs
from splitleak.partition import passive_columns
from splitleak.rundir import RunDir
from splitleak.transport import PARTY_ID_KEY, SESSION_KEY, create_channel
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc

log = logging.getLogger("passive_party")


class PartyError(Exception):
    """This passive party cannot go on; the message says why."""


def load_bottom(cfg: ExperimentConfig, party_id: int) -> BottomTrainer:
    """Load only this party's columns (the dataset's label-free path) and build its model."""
    dataset = build_dataset(cfg.dataset.name, cfg.dataset.params)
    schema = dataset.schema()
    columns = passive_columns(cfg, schema)[party_id]
    inputs = load_party_inputs(cfg, dataset, columns)
    return BottomTrainer(cfg, party_id, inputs, cfg.output_width(schema.num_classes))


async def run_party(cfg: ExperimentConfig, party_id: int, address: str, run: RunDir,
                    bottom: BottomTrainer | None = None) -> None:
    torch.set_num_threads(cfg.run.torch_threads)
    if not 1 <= party_id <= cfg.topology.passive_parties:
        raise PartyError(f"--party-id {party_id} is not in this run's parties "
                         f"1..{cfg.topology.passive_parties}")
    bottom = bottom or load_bottom(cfg, party_id)
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="passive-compute")
    loop = asyncio.get_running_loop()

    def compute(fn: Any, *args: Any) -> Any:
        return loop.run_in_executor(executor, fn, *args)

    try:
        async with create_channel(address, cfg.topology) as channel:
            stub = pb_grpc.LabelPartyStub(channel)
            plan = await _join(stub, cfg, bottom)
            log.info("party %d joined run %s: %d train steps", party_id, plan.run_id,
                     plan.total_train_steps)
            call = stub.Train(metadata=((PARTY_ID_KEY, str(party_id)), (SESSION_KEY, plan.session)))
            await _answer(call, bottom, compute)
        await compute(bottom.save, run.bottom_model(party_id))
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


async def _join(stub: pb_grpc.LabelPartyStub, cfg: ExperimentConfig,
                bottom: BottomTrainer) -> pb.TrainingPlan:
    request = pb.JoinRequest(protocol_version=PROTOCOL_VERSION, party_id=bottom.party_id,
                             embedding_shape=bottom.embedding_shape, config_hash=cfg.hash,
                             num_rows=bottom.inputs.num_rows)
    try:
        return await stub.Join(request, wait_for_ready=True,
                               timeout=cfg.topology.join_deadline_s)
    except grpc.aio.AioRpcError as err:
        raise PartyError(_describe(err, "joining")) from None


async def _answer(call: Any, bottom: BottomTrainer, compute: Any) -> None:
    """The step loop: apply the gradient (if any), then compute the asked batch."""
    num_rows = bottom.inputs.num_rows
    try:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                raise PartyError("the label party closed the stream before saying done")
            if message.HasField("cut_gradient"):
                gradient = _decode_gradient(message, bottom)
                await compute(bottom.backward, gradient)
            if message.done:
                await call.done_writing()
                break
            batch = message.next_batch
            ids = _decode_batch_ids(batch, num_rows)
            activation = await compute(bottom.forward, ids, batch.phase == pb.TRAIN)
            await call.write(pb.PartyMessage(phase=batch.phase, step=batch.step,
                                             activation=encode_tensor(activation)))
        code = await call.code()
        if code != grpc.StatusCode.OK:
            raise PartyError(f"the label party ended the stream with {code.name}: "
                             f"{await call.details()}")
    except grpc.aio.AioRpcError as err:
        raise PartyError(_describe(err, "training")) from None
    except PartyError:
        call.cancel()
        raise


def _decode_gradient(message: pb.LabelPartyMessage, bottom: BottomTrainer) -> torch.Tensor:
    shape = bottom.pending_shape
    if shape is None:
        raise PartyError(f"received a cut gradient for step {message.gradient_step} but no "
                         "train activation is waiting for one")
    try:
        return decode_tensor(message.cut_gradient,
                             field=f"cut gradient (step {message.gradient_step})",
                             dtype=torch.float32, shape=shape, finite=True)
    except CodecError as err:
        raise PartyError(str(err)) from None


def _decode_batch_ids(batch: pb.Batch, num_rows: int) -> np.ndarray:
    try:
        ids = decode_ids(batch.sample_ids, field=f"sample ids (step {batch.step})")
    except CodecError as err:
        raise PartyError(str(err)) from None
    if ids.size == 0 or ids.min() < 0 or ids.max() >= num_rows:
        raise PartyError(f"sample ids of step {batch.step} fall outside this party's "
                         f"{num_rows} rows")
    if batch.phase not in (pb.TRAIN, pb.EVAL):
        raise PartyError(f"batch of step {batch.step} has no valid phase ({batch.phase})")
    return ids


def _describe(err: grpc.aio.AioRpcError, doing: str) -> str:
    return f"label party refused or failed while {doing}: {err.code().name}: {err.details()}"
