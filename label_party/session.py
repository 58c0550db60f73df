"""One training run as the label party sees it: who joined, their streams, the step barrier."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field

import grpc
import torch

from label_party.schedule import Batch, Phase
from label_party.setup import LabelPartyData
from splitleak.codec import CodecError, decode_tensor, encode_ids, encode_tensor
from splitleak.config import PROTOCOL_VERSION, ExperimentConfig
from splitleak.tls import passive_identity
from splitleak.v1 import split_learning_pb2 as pb


class SessionError(Exception):
    """A request the session refuses; carries the gRPC status code to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str, party_id: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.party_id = party_id


@dataclass(frozen=True)
class PartyGone:
    """Put on a party's inbound queue when its stream ends or breaks."""

    reason: str


@dataclass
class PartyStream:
    party_id: int
    inbound: asyncio.Queue = field(default_factory=asyncio.Queue)  # PartyMessage | PartyGone
    outbound: asyncio.Queue = field(default_factory=asyncio.Queue)  # message | SessionError | None
    closed: asyncio.Event = field(default_factory=asyncio.Event)


class Session:
    """Admits the N passive parties, then lends their streams to the step loop."""

    def __init__(self, cfg: ExperimentConfig, data: LabelPartyData, run_id: str) -> None:
        self.cfg = cfg
        self.data = data
        self.run_id = run_id
        self.token = secrets.token_hex(16)
        self.party_ids = list(range(1, cfg.topology.passive_parties + 1))
        self.joined: dict[int, pb.JoinRequest] = {}
        self.streams: dict[int, PartyStream] = {}
        self.all_streams_open = asyncio.Event()
        self.started = False

    # -- admission -----------------------------------------------------------------------
    def _check_identity(self, k: int, peer: str | None) -> None:
        """With TLS, a party may only speak for the id its certificate names."""
        if self.cfg.topology.tls and peer != passive_identity(k):
            raise SessionError(grpc.StatusCode.PERMISSION_DENIED,
                               f"the client certificate names {peer!r}, which may not act as "
                               f"passive party {k} (expected {passive_identity(k)!r})", k)

    def join(self, request: pb.JoinRequest, peer: str | None = None) -> pb.TrainingPlan:
        k = request.party_id
        if request.protocol_version != PROTOCOL_VERSION:
            raise SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"protocol version {request.protocol_version} is not supported; "
                               f"this label party speaks version {PROTOCOL_VERSION}", k)
        self._check_known(k)
        self._check_identity(k, peer)
        if k in self.joined:
            raise SessionError(grpc.StatusCode.ALREADY_EXISTS,
                               f"passive party {k} has already joined this run", k)
        if self.started:
            raise SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                               "training has already started; no party can join now", k)
        if request.config_hash != self.cfg.hash:
            raise SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"passive party {k} loaded config {request.config_hash!r} but the "
                               f"label party runs {self.cfg.hash!r}: every party must use the "
                               "same experiment file", k)
        if request.num_rows != self.data.schema.num_rows:
            raise SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"passive party {k} holds {request.num_rows} rows but the label "
                               f"party has {self.data.schema.num_rows}: sample ids do not align", k)
        shape = tuple(request.embedding_shape)
        if not shape or any(s <= 0 for s in shape):
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"passive party {k} announced embedding shape {list(shape)}; "
                               "every dimension must be positive", k)
        if self.cfg.model.aggregation != "concat" or self.cfg.model.top == "none":
            for other, req in self.joined.items():
                if tuple(req.embedding_shape) != shape:
                    raise SessionError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"passive party {k} announced embedding shape {list(shape)} but party "
                        f"{other} announced {list(req.embedding_shape)}; aggregation "
                        f"'{self.cfg.model.aggregation}' needs equal shapes", k)
        self.joined[k] = request
        plan = self.data.plan
        return pb.TrainingPlan(
            run_id=self.run_id, session=self.token, epochs=plan.epochs,
            batch_size=plan.batch_size, seed=self.cfg.run.seed,
            steps_per_epoch=plan.steps_per_epoch, total_train_steps=plan.total_train_steps,
            eval_interval=plan.eval_interval, num_passive_parties=len(self.party_ids),
            step_deadline_seconds=self.cfg.topology.step_deadline_s)

    def _check_known(self, k: int) -> None:
        if k not in self.party_ids:
            raise SessionError(grpc.StatusCode.PERMISSION_DENIED,
                               f"unknown party id {k}; this run has passive parties "
                               f"1..{len(self.party_ids)}")

    def open_stream(self, party_id: str | None, token: str | None,
                    peer: str | None = None) -> PartyStream:
        if party_id is None or not party_id.isdigit():
            raise SessionError(grpc.StatusCode.UNAUTHENTICATED,
                               f"Train stream without a valid 'splitleak-party-id' metadata "
                               f"entry (got {party_id!r})")
        k = int(party_id)
        self._check_known(k)
        self._check_identity(k, peer)
        if k not in self.joined or token != self.token:
            raise SessionError(grpc.StatusCode.PERMISSION_DENIED,
                               f"passive party {k} opened a Train stream without joining this "
                               "run (call Join first and send its session token)", k)
        if k in self.streams:
            raise SessionError(grpc.StatusCode.ALREADY_EXISTS,
                               f"passive party {k} already has a Train stream open", k)
        stream = self.streams[k] = PartyStream(k)
        if len(self.streams) == len(self.party_ids):
            self.started = True
            self.all_streams_open.set()
        return stream

    async def wait_for_parties(self) -> None:
        try:
            await asyncio.wait_for(self.all_streams_open.wait(), self.cfg.topology.join_deadline_s)
        except TimeoutError:
            missing = [k for k in self.party_ids if k not in self.streams]
            raise SessionError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"passive part{'y' if len(missing) == 1 else 'ies'} "
                               f"{', '.join(map(str, missing))} did not join within "
                               f"{self.cfg.topology.join_deadline_s:g} s",
                               missing[0]) from None

    def embedding_shapes(self) -> dict[int, tuple[int, ...]]:
        return {k: tuple(self.joined[k].embedding_shape) for k in self.party_ids}

    # -- ending --------------------------------------------------------------------------
    def abort(self, error: SessionError) -> None:
        """Tell every open stream the run is over and why."""
        for k, stream in self.streams.items():
            if error.party_id in (None, k):
                stream.outbound.put_nowait(error)
            else:
                stream.outbound.put_nowait(SessionError(
                    grpc.StatusCode.ABORTED, f"run aborted: {error.message}", error.party_id))

    async def wait_closed(self, timeout: float) -> None:
        waits = [s.closed.wait() for s in self.streams.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
        except TimeoutError:
            pass


class NetworkExchange:
    """The driver's Exchange over the parties' Train streams, with a per-step deadline."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.shapes = session.embedding_shapes()
        self.deadline = session.cfg.topology.step_deadline_s
        self.bytes_sent = 0
        self.bytes_received = 0

    def _send(self, gradients: dict[int, torch.Tensor] | None, gradient_batch: Batch | None,
              next_batch: Batch | None) -> None:
        nxt = None
        if next_batch is not None:
            nxt = pb.Batch(phase=int(next_batch.phase), epoch=next_batch.epoch,
                           step=next_batch.step, sample_ids=encode_ids(next_batch.sample_ids))
        for k, stream in self.session.streams.items():
            msg = pb.LabelPartyMessage(next_batch=nxt, done=next_batch is None)
            if gradients is not None and gradient_batch is not None:
                msg.cut_gradient.CopyFrom(encode_tensor(gradients[k]))
                msg.gradient_step = gradient_batch.step
                msg.gradient_epoch = gradient_batch.epoch
            self.bytes_sent += msg.ByteSize()
            stream.outbound.put_nowait(msg)

    async def exchange(self, gradients: dict[int, torch.Tensor] | None,
                       gradient_batch: Batch | None, next_batch: Batch) -> dict[int, torch.Tensor]:
        self._send(gradients, gradient_batch, next_batch)
        return await self._collect(next_batch)

    async def finish(self, gradients: dict[int, torch.Tensor] | None,
                     gradient_batch: Batch | None) -> None:
        self._send(gradients, gradient_batch, None)
        for stream in self.session.streams.values():
            stream.outbound.put_nowait(None)

    async def _collect(self, batch: Batch) -> dict[int, torch.Tensor]:
        streams = self.session.streams
        waiting = {asyncio.ensure_future(s.inbound.get()): k for k, s in streams.items()}
        activations: dict[int, torch.Tensor] = {}
        end = time.monotonic() + self.deadline
        try:
            while waiting:
                done, _ = await asyncio.wait(waiting, timeout=max(0.0, end - time.monotonic()),
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    raise self._stalled(sorted(waiting.values()), batch)
                for task in done:
                    k = waiting.pop(task)
                    activations[k] = self._accept(k, task.result(), batch)
        finally:
            for task in waiting:
                task.cancel()
        return activations

    def _stalled(self, parties: list[int], batch: Batch) -> SessionError:
        who = ", ".join(f"passive party {k}" for k in parties)
        return SessionError(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"{who} sent no activation for {batch.phase.name} step {batch.step} "
                            f"within the {self.deadline:g} s step deadline", parties[0])

    def _accept(self, k: int, msg: pb.PartyMessage | PartyGone, batch: Batch) -> torch.Tensor:
        if isinstance(msg, PartyGone):
            raise SessionError(grpc.StatusCode.UNAVAILABLE,
                               f"passive party {k} {msg.reason} during {batch.phase.name} "
                               f"step {batch.step}", k)
        self.bytes_received += msg.ByteSize()
        if msg.phase != batch.phase or msg.step != batch.step:
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"passive party {k} sent an activation for "
                               f"{Phase(msg.phase).name if msg.phase in (1, 2) else msg.phase} "
                               f"step {msg.step}, but {batch.phase.name} step {batch.step} "
                               "was asked", k)
        try:
            return decode_tensor(msg.activation,
                                 field=f"passive party {k} activation ({batch.phase.name} "
                                       f"step {batch.step})",
                                 dtype=torch.float32,
                                 shape=(batch.sample_ids.size, *self.shapes[k]), finite=True)
        except CodecError as err:
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT, str(err), k) from None
