"""The LabelParty gRPC service: decode, one session call, encode. Nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from label_party.session import PartyGone, PartyStream, Session, SessionError
from splitleak.tls import peer_identity
from splitleak.transport import PARTY_ID_KEY, SESSION_KEY
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc
from splitleak.wire import Malformed, add_service


async def _abort(context: grpc.aio.ServicerContext, error: SessionError) -> None:
    """The one place where a domain error becomes a gRPC status."""
    await context.abort(error.code, error.message)


def add_label_party(server: grpc.aio.Server, session: Session) -> None:
    add_service(server, pb_grpc.add_LabelPartyServicer_to_server, LabelPartyServicer(session),
                session.cfg.topology.max_message_mb)


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

    async def Train(self, request_iterator: AsyncIterator[pb.PartyMessage | Malformed],  # noqa: N802
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.LabelPartyMessage]:
        metadata = dict(context.invocation_metadata() or ())
        try:
            stream = self.session.open_stream(metadata.get(PARTY_ID_KEY),
                                              metadata.get(SESSION_KEY), peer_identity(context))
        except SessionError as err:
            await _abort(context, err)
            return
        pump = asyncio.create_task(_pump(request_iterator, stream,
                                         self.session.cfg.topology.max_message_mb))
        try:
            while (item := await stream.outbound.get()) is not None:
                if isinstance(item, SessionError):
                    await _abort(context, item)
                yield item
        except asyncio.CancelledError:
            stream.gone(PartyGone("dropped its connection"))
            raise
        finally:
            pump.cancel()
            stream.closed.set()


async def _pump(requests: AsyncIterator[pb.PartyMessage | Malformed], stream: PartyStream,
                limit_mb: int) -> None:
    """Move a party's answers onto its bounded inbound queue; refuse what was not asked for;
    mark how the stream ended. A message between the limit and twice it is refused here,
    naming the limit; gRPC cuts a stream off at twice the limit (bounding what a peer can make
    this process hold), and the servicer then sees the same end as a party that died, so the
    end names both, the likelier (the party exited) first."""
    try:
        async for message in requests:
            refusal = stream.admit(message)
            if refusal is not None:
                stream.refuse(refusal)  # a refused message, or the party's own failure report
                return
            await stream.inbound.put(message)
    except asyncio.CancelledError:
        raise
    except Exception as err:  # noqa: BLE001 - any transport failure ends this party
        stream.gone(PartyGone(f"lost its connection ({type(err).__name__}: {err})"))
        return
    # gRPC shows both ends alike (nothing in the call tells them apart): the likelier first.
    stream.gone(PartyGone(f"ended its stream, most likely because it exited or lost its "
                          f"connection (a message over {2 * limit_mb} MiB, twice "
                          f"topology.max_message_mb = {limit_mb}, which gRPC cuts off, would "
                          "end it the same way)"))
