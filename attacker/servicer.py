"""The AttackerSidecar gRPC service: decode each record, append it, acknowledge at the end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from attacker.store import GradientStore, RecordError
from splitleak.codec import CodecError, decode_ids, decode_view
from splitleak.tls import passive_identity, peer_identity
from splitleak.v1 import attacker_pb2 as pb
from splitleak.v1 import attacker_pb2_grpc as pb_grpc
from splitleak.v1 import tensor_pb2

_OPTIONAL = ("activation", "first_layer_gradient")


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

    async def Record(self, request_iterator: AsyncIterator[pb.GradientRecord],  # noqa: N802
                     context: grpc.aio.ServicerContext) -> pb.RecordSummary:
        records = rows = 0
        party: int | None = None
        try:
            async for record in request_iterator:
                if party is None:
                    party = self._admit(record, peer_identity(context))
                rows += self._append(record, party)
                records += 1
        except RecordError as err:
            await context.abort(grpc.StatusCode[err.status], str(err))
        finally:
            if party is not None:
                self.streaming.discard(party)
        if party is not None:
            self.finished.add(party)
            if self.observe <= self.finished:
                self.store.close()
                self.all_finished.set()
        return pb.RecordSummary(records=records, rows=rows)

    def _admit(self, record: pb.GradientRecord, peer: str | None) -> int:
        k = record.party_id
        if self.tls and peer != passive_identity(k):
            raise RecordError(
                f"the client certificate names {peer!r}, which may not send the "
                f"records of passive party {k}", status="PERMISSION_DENIED")
        if k not in self.observe:
            raise RecordError(
                f"records from passive party {k} are not accepted: this sidecar "
                f"observes part{'y' if len(self.observe) == 1 else 'ies'} "
                f"{', '.join(map(str, sorted(self.observe)))}", status="PERMISSION_DENIED")
        if self.run_id and record.run_id != self.run_id:
            raise RecordError(
                f"record of run {record.run_id!r}, but this sidecar records run "
                f"{self.run_id!r}", status="FAILED_PRECONDITION")
        if k in self.streaming or k in self.finished:
            raise RecordError(f"passive party {k} already streamed its records to this sidecar",
                              status="ALREADY_EXISTS")
        self.streaming.add(k)
        return k

    def _append(self, record: pb.GradientRecord, party: int) -> int:
        if record.party_id != party:
            raise RecordError(f"a stream opened by passive party {party} carried a record of "
                              f"party {record.party_id}")
        where = f"party {party} step {record.step}"
        try:
            ids = decode_ids(record.sample_ids, field=f"{where} sample_ids")
            names = ["cut_gradient"] + [n for n in _OPTIONAL if record.HasField(n)]
            arrays = {n: decode_view(getattr(record, n), field=f"{where} {n}",
                                     dtype=tensor_pb2.FLOAT32) for n in names}
        except CodecError as err:
            raise RecordError(str(err)) from None
        if ids.size == 0:
            raise RecordError(f"{where}: empty record")
        for name, array in arrays.items():
            if array.ndim < 2 or array.shape[0] != ids.size:
                raise RecordError(f"{where} {name}: shape {list(array.shape)} does not match "
                                  f"{ids.size} sample ids")
        return self.store.append(party, record.epoch, record.step, ids, arrays)

