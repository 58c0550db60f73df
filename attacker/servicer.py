"""The AttackerSidecar gRPC service: decode each record, append it, acknowledge at the end."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator

import grpc
import numpy as np

from attacker.store import GradientStore, RecordError
from splitleak.codec import CodecError, decode_ids, decode_tensor, decode_view
from splitleak.tls import passive_identity, peer_identity
from splitleak.v1 import attacker_pb2 as pb
from splitleak.v1 import attacker_pb2_grpc as pb_grpc
from splitleak.v1 import tensor_pb2
from splitleak.wire import Malformed, add_service, echo

log = logging.getLogger("attacker")
_OPTIONAL = ("activation", "first_layer_gradient")
_RECORDED = (tensor_pb2.FLOAT32, tensor_pb2.FLOAT16, tensor_pb2.BFLOAT16)  # [wire] dtypes
SYNC_TIMEOUT = 60.0  # s: a checkpoint Sync without a deadline waits at most this


def add_sidecar(server: grpc.aio.Server, servicer: AttackerServicer, limit_mb: int) -> None:
    add_service(server, pb_grpc.add_AttackerSidecarServicer_to_server, servicer, limit_mb)


def _received(tensor: tensor_pb2.Tensor, field: str) -> np.ndarray:
    """A recorded tensor as float32: dense float32 is viewed without a copy; a float16 /
    bfloat16 wire (`[wire] dtype`) is widened and a sparse one (`[wire] sparse`) expanded,
    both exactly, so the log holds what the party received."""
    if tensor.dtype == tensor_pb2.FLOAT32 and not tensor.sparse:
        return decode_view(tensor, field=field, dtype=tensor_pb2.FLOAT32)
    return decode_tensor(tensor, field=field, dtype=_RECORDED).float().numpy()


class AttackerServicer(pb_grpc.AttackerSidecarServicer):
    def __init__(self, store: GradientStore, observe: set[int], run_id: str | None = None,
                 tls: bool = False) -> None:
        self.store = store
        self.tls = tls
        self.observe = observe
        self.run_id = run_id
        self.finished: set[int] = set()
        self.all_finished = asyncio.Event()
        self.streaming: set[int] = set()
        self.refused: dict[int, str] = {}  # the last refusal of each observed party
        self._appended = asyncio.Condition()

    async def _refuse(self, context: grpc.aio.ServicerContext, err: RecordError,
                      party: int | None) -> None:
        """Log the refusal and its reason here, then answer with its status."""
        log.warning("refused %s: %s [%s]", f"passive party {party}" if party is not None
                    else "a record stream", err, err.status)
        if party in self.observe:
            self.refused[party] = str(err)
        await context.abort(grpc.StatusCode[err.status], str(err))

    async def Record(self, request_iterator: AsyncIterator[pb.GradientRecord | Malformed],  # noqa: N802
                     context: grpc.aio.ServicerContext) -> pb.RecordSummary:
        records = rows = 0
        party: int | None = None
        claimed: int | None = None
        try:
            async for record in request_iterator:
                if isinstance(record, Malformed):
                    raise RecordError(record.describe(), status=record.code.name)
                claimed = record.party_id
                if party is None:
                    party = self._admit(record.run_id, record.party_id, peer_identity(context))
                    self.streaming.add(party)
                rows += self._append(record, party)
                records += 1
                async with self._appended:
                    self._appended.notify_all()
        except RecordError as err:
            await self._refuse(context, err, party if party is not None else claimed)
        finally:
            if party is not None:
                self.streaming.discard(party)
        if party is not None:
            self.finished.add(party)
            if self.observe <= self.finished:
                self.store.close()
                self.all_finished.set()
        return pb.RecordSummary(records=records, rows=rows)

    async def Sync(self, request: pb.SyncRequest,  # noqa: N802
                   context: grpc.aio.ServicerContext) -> pb.RecordSummary:
        try:
            party = self._admit(request.run_id, request.party_id, peer_identity(context),
                                streaming_ok=request.mode == pb.SyncRequest.CHECKPOINT)
            if request.mode == pb.SyncRequest.CHECKPOINT:
                await self._wait_for(party, request.step, context.time_remaining())
                self.store.sync(party)
            elif request.mode == pb.SyncRequest.REWIND:
                self.store.rewind(party, request.step)
            else:
                raise RecordError(f"Sync mode {request.mode} is not one of CHECKPOINT, REWIND")
        except RecordError as err:
            await self._refuse(context, err, request.party_id)
            raise  # unreachable: abort raises
        records, rows = self.store.counts(party)
        return pb.RecordSummary(records=records, rows=rows)

    async def _wait_for(self, party: int, step: int, remaining: float | None) -> None:
        """Until the log holds the party's record of train step `step` - 1."""
        def arrived() -> bool:
            last = self.store.last_step(party)
            return step == 0 or (last is not None and last >= step - 1)

        timeout = min(remaining, SYNC_TIMEOUT) if remaining is not None else SYNC_TIMEOUT
        try:
            async with self._appended:
                await asyncio.wait_for(self._appended.wait_for(arrived), timeout)
        except TimeoutError:
            raise RecordError(f"passive party {party}: the record of step {step - 1} did not "
                              f"arrive within {timeout:g} s (last logged: step "
                              f"{self.store.last_step(party)})", status="DEADLINE_EXCEEDED") from None

    def _admit(self, run_id: str, k: int, peer: str | None, streaming_ok: bool = False) -> int:
        if self.tls and peer != passive_identity(k):
            raise RecordError(
                f"the client certificate names {echo(peer)}, which may not send the "
                f"records of passive party {k}", status="PERMISSION_DENIED")
        if k not in self.observe:
            raise RecordError(
                f"records from passive party {k} are not accepted: this sidecar "
                f"observes part{'y' if len(self.observe) == 1 else 'ies'} "
                f"{', '.join(map(str, sorted(self.observe)))}", status="PERMISSION_DENIED")
        if self.run_id and run_id != self.run_id:
            raise RecordError(
                f"record of run {echo(run_id)}, but this sidecar records run "
                f"{self.run_id!r}", status="FAILED_PRECONDITION")
        if k in self.streaming and not streaming_ok:
            raise RecordError(f"passive party {k} is already streaming its records to this "
                              "sidecar", status="ALREADY_EXISTS")
        if k in self.finished and not streaming_ok:
            raise RecordError(f"passive party {k} already streamed its records to this sidecar",
                              status="ALREADY_EXISTS")
        return k

    def _append(self, record: pb.GradientRecord, party: int) -> int:
        if record.party_id != party:
            raise RecordError(f"a stream opened by passive party {party} carried a record of "
                              f"party {record.party_id}")
        where = f"party {party} step {record.step}"
        try:
            ids = decode_ids(record.sample_ids, field=f"{where} sample_ids")
            names = ["cut_gradient"] + [n for n in _OPTIONAL if record.HasField(n)]
            arrays = {n: _received(getattr(record, n), f"{where} {n}") for n in names}
        except CodecError as err:
            raise RecordError(str(err)) from None
        if ids.size == 0:
            raise RecordError(f"{where}: empty record")
        for name, array in arrays.items():
            if array.ndim < 2 or array.shape[0] != ids.size:
                raise RecordError(f"{where} {name}: shape {list(array.shape)} does not match "
                                  f"{ids.size} sample ids")
            if math.prod(array.shape[1:]) == 0:
                raise RecordError(f"{where} {name}: shape {list(array.shape)} has no values per "
                                  "row (a gradient of width 0)")
        return self.store.append(party, record.epoch, record.step, ids, arrays)
