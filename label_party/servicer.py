"""The LabelParty gRPC service: decode, one session call, encode. Nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from label_party.session import PartyGone, Session, SessionError
from splitleak.tls import peer_identity
from splitleak.transport import PARTY_ID_KEY, SESSION_KEY
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc


async def _abort(context: grpc.aio.ServicerContext, error: SessionError) -> None:
    """The one place where a domain error becomes a gRPC status."""
    await context.abort(error.code, error.message)


class LabelPartyServicer(pb_grpc.LabelPartyServicer):
    def __init__(self, session: Session) -> None:
        self.session = session

    async def Join(self, request: pb.JoinRequest,  # noqa: N802 (gRPC method name)
                   context: grpc.aio.ServicerContext) -> pb.TrainingPlan:
        try:
            return self.session.join(request, peer_identity(context))
        except SessionError as err:
            await _abort(context, err)
            raise  # unreachable: abort raises

    async def Train(self, request_iterator: AsyncIterator[pb.PartyMessage],  # noqa: N802
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.LabelPartyMessage]:
        metadata = dict(context.invocation_metadata() or ())
        try:
            stream = self.session.open_stream(metadata.get(PARTY_ID_KEY),
                                              metadata.get(SESSION_KEY), peer_identity(context))
        except SessionError as err:
            await _abort(context, err)
            return
        pump = asyncio.create_task(_pump(request_iterator, stream.inbound))
        try:
            while (item := await stream.outbound.get()) is not None:
                if isinstance(item, SessionError):
                    await _abort(context, item)
                yield item
        except asyncio.CancelledError:
            stream.inbound.put_nowait(PartyGone("dropped its connection"))
            raise
        finally:
            pump.cancel()
            stream.closed.set()


async def _pump(requests: AsyncIterator[pb.PartyMessage], inbound: asyncio.Queue) -> None:
    """Move a party's messages onto its inbound queue; mark how the stream ended."""
    try:
        async for message in requests:
            inbound.put_nowait(message)
    except asyncio.CancelledError:
        raise
    except Exception as err:  # noqa: BLE001 - any transport failure ends this party
        inbound.put_nowait(PartyGone(f"lost its connection ({type(err).__name__}: {err})"))
        return
    inbound.put_nowait(PartyGone("closed its stream"))
