"""The driver's Exchange over the parties' Train streams: the step barrier and its deadline."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
import torch

from label_party.schedule import Batch, Phase
from label_party.session import PartyGone, Session, SessionError
from label_party.taps import ReceivedTaps
from splitleak.checkpoint import Position
from splitleak.codec import WIRE_FLOATS, CodecError, decode_tensor, encode_ids, encode_tensor
from splitleak.timing import StepTimer, mark_startup, timed
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import tensor_pb2
from splitleak.watchdog import Heartbeat

_WIRE_PHASE = {Phase.TRAIN: pb.TRAIN, Phase.EVAL: pb.EVAL}

log = logging.getLogger("label_party")
TICK = 0.5  # s: how often the barrier checks its own clock
# A tick that ends this much later than asked means this process itself was not running
# (SIGSTOP, a swapped-out VM): that time is not counted against the parties.
STALL_TOLERANCE = 2.0
GRACE = 0.5  # s: read what already arrived before declaring a party stalled


class NetworkExchange:
    """Sends each party its batch (and the previous cut gradient), collects the answers."""

    def __init__(self, session: Session, taps: ReceivedTaps | None = None,
                 heartbeat: Heartbeat | None = None) -> None:
        self.session = session
        # The batch the label party computes, None while it waits for the parties (or the
        # sidecar) or checkpoints: what its watchdog watches (two assignments a step, no more).
        self.heartbeat = heartbeat or Heartbeat()
        self.taps = taps  # [threat.receiver]: what this party receives goes to the sidecar
        self._received: dict[int, tensor_pb2.Tensor] = {}  # the victims' raw activations
        self.shapes = session.embedding_shapes()
        self.deadline = session.cfg.topology.step_deadline_s
        self.wire = WIRE_FLOATS[session.cfg.wire.dtype]
        self.sparse = session.cfg.wire.sparse  # (indices, values) when that is smaller
        self._bytes = {"sent": 0, "received": 0}
        # Messages not yet counted: a big message's ByteSize() costs ≈ 0.1 ms, so they are
        # counted while the label party waits for the parties' answers, not before it sends.
        self._uncounted: list[tuple[str, Any]] = []
        self.timer = StepTimer()  # the driver's too: encode/decode of train steps
        # The parties by when their last answers arrived, the last first: the slowest party's
        # message is handed to gRPC first, so the step's longest path starts first.
        self._slowest_first: list[int] = []

    def _send(self, gradients: dict[int, torch.Tensor] | None, gradient_batch: Batch | None,
              next_batch: Batch | None, checkpoint: Position | None = None) -> None:
        on = next_batch is not None and timed(next_batch.phase is Phase.TRAIN, next_batch.step)
        with self.timer.span("encode", on):
            self._queue(gradients, gradient_batch, next_batch, checkpoint)

    def _queue(self, gradients: dict[int, torch.Tensor] | None, gradient_batch: Batch | None,
               next_batch: Batch | None, checkpoint: Position | None) -> None:
        nxt = None
        if next_batch is not None:
            nxt = pb.Batch(phase=_WIRE_PHASE[next_batch.phase], epoch=next_batch.epoch,
                           step=next_batch.step, sample_ids=encode_ids(next_batch.sample_ids),
                           variant=next_batch.variant)
        streams = self.session.streams
        for k in [*self._slowest_first, *(k for k in streams if k not in self._slowest_first)]:
            stream = streams[k]
            msg = pb.LabelPartyMessage(next_batch=nxt, done=next_batch is None and checkpoint is None)
            if gradients is not None and gradient_batch is not None:
                msg.cut_gradient.CopyFrom(encode_tensor(gradients[k].to(self.wire), sparse=self.sparse))
                msg.gradient_step = gradient_batch.step
                msg.gradient_epoch = gradient_batch.epoch
            if checkpoint is not None:
                msg.checkpoint.step = checkpoint.step
                msg.checkpoint.batches = checkpoint.batches
            self._uncounted.append(("sent", msg))
            if msg.done:
                stream.outbound.put_nowait(msg)
            else:
                stream.ask(msg)

    @property
    def bytes_sent(self) -> int:
        """Protobuf bytes of every message this party sent (counted once the parties work)."""
        self._count()
        return self._bytes["sent"]

    @property
    def bytes_received(self) -> int:
        self._count()
        return self._bytes["received"]

    def _count(self) -> None:
        for direction, msg in self._uncounted:
            self._bytes[direction] += msg.ByteSize()
        self._uncounted.clear()

    async def exchange(self, gradients: dict[int, torch.Tensor] | None,
                       gradient_batch: Batch | None, next_batch: Batch,
                       meanwhile: Callable[[], object] | None = None) -> dict[int, torch.Tensor]:
        self._send(gradients, gradient_batch, next_batch)
        await asyncio.sleep(0)  # the streams hand the messages to gRPC first
        if meanwhile is not None:  # the parties compute meanwhile: off the step's critical path
            with self.timer.span("update", timed(next_batch.phase is Phase.TRAIN, next_batch.step)):
                meanwhile()
        self._count()
        during = f"{next_batch.phase.name} step {next_batch.step}"
        self.heartbeat.beat = None
        activations = await self._collect(f"activation for {during}",
                                          lambda k, m: self._activation(k, m, next_batch, during))
        if next_batch.phase is Phase.TRAIN:
            mark_startup("first_step")  # every party answered a train batch: training runs
        if self.taps is not None and next_batch.phase is Phase.TRAIN:
            await self.taps.record(next_batch, self._received)
        self.heartbeat.beat = next_batch  # the label party's own step: the watchdog's to time
        return activations

    async def checkpoint(self, gradients: dict[int, torch.Tensor] | None,
                         gradient_batch: Batch | None, position: Position,
                         deadline: float | None = None,
                         late_answers: bool = False) -> dict[int, pb.CheckpointAck]:
        """Deliver the pending gradients with a checkpoint request; every party's ack.
        `late_answers`: an activation asked before the request may still arrive first (a
        checkpoint after a failure); it is skipped."""
        self.heartbeat.beat = None
        self._send(gradients, gradient_batch, None, position)
        during = f"the checkpoint at step {position.step}"
        return await self._collect(f"acknowledgement of {during}",
                                   lambda k, m: self._ack(k, m, position, during, late_answers),
                                   deadline)

    async def finish(self, gradients: dict[int, torch.Tensor] | None,
                     gradient_batch: Batch | None) -> None:
        self.heartbeat.beat = None
        self._send(gradients, gradient_batch, None)
        for stream in self.session.streams.values():
            stream.outbound.put_nowait(None)

    async def _collect(self, what: str, accept: Callable[[int, Any], Any],
                       deadline: float | None = None) -> dict[int, Any]:
        """Each party's accepted answer; `accept` returns None to keep waiting (a late answer
        to an earlier request). Fails naming the first party that sends something wrong, ends
        its stream, or is silent past the deadline (time this process itself was stopped is
        not counted: a stalled label party must not blame a party whose answer arrived)."""
        deadline = self.deadline if deadline is None else deadline
        # `what` completes "passive party k sent no ...".
        streams = self.session.streams
        waiting = {asyncio.ensure_future(s.inbound.get()): k for k, s in streams.items()}
        answers: dict[int, Any] = {}
        end = time.monotonic() + deadline
        try:
            while waiting:
                asked = min(TICK, max(0.0, end - time.monotonic()))
                before = time.monotonic()
                done, _ = await asyncio.wait(waiting, timeout=asked, return_when=asyncio.FIRST_COMPLETED)
                stalled = time.monotonic() - before - asked
                if stalled > STALL_TOLERANCE:
                    log.warning("the label party itself was not running for %.1f s while waiting "
                                "for %s; the parties' deadline is extended by that", stalled, what)
                    end += stalled
                if not done and time.monotonic() >= end:
                    done, _ = await asyncio.wait(waiting, timeout=GRACE,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if not done:
                        raise self._silent(sorted(waiting.values()), what, deadline)
                for task in done:
                    k = waiting.pop(task)
                    answer = accept(k, task.result())
                    if answer is None:
                        waiting[asyncio.ensure_future(streams[k].inbound.get())] = k
                    else:
                        answers[k] = answer
            self._slowest_first = list(reversed(answers))
        finally:
            for task in waiting:
                task.cancel()
        return answers

    @staticmethod
    def _silent(parties: list[int], what: str, deadline: float) -> SessionError:
        who = ", ".join(f"passive party {k}" for k in parties)
        return SessionError(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"{who} sent no {what} within the {deadline:g} s "
                            "step deadline", parties[0])

    def _check(self, k: int, msg: pb.PartyMessage | PartyGone, during: str) -> pb.PartyMessage:
        """What every answer must be: not the end of the stream (or a refusal, or the party's
        report of why it stops: the pump turns those into the stream's end)."""
        if isinstance(msg, PartyGone):
            if msg.error is not None:
                raise msg.error
            raise SessionError(grpc.StatusCode.UNAVAILABLE,
                               f"passive party {k} {msg.reason} during {during}", k)
        self._uncounted.append(("received", msg))
        return msg

    def _activation(self, k: int, msg: pb.PartyMessage | PartyGone, batch: Batch,
                    during: str) -> torch.Tensor:
        msg = self._check(k, msg, during)
        if msg.HasField("checkpoint") or msg.phase != batch.phase or msg.step != batch.step:
            got = ("a checkpoint acknowledgement" if msg.HasField("checkpoint") else
                   f"an activation for {Phase(msg.phase).name if msg.phase in (1, 2) else msg.phase}"
                   f" step {msg.step}")
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"passive party {k} sent {got}, but {batch.phase.name} step "
                               f"{batch.step} was asked", k)
        if self.taps is not None and k in self.taps.taps:
            self._received[k] = msg.activation
        try:
            with self.timer.span("decode", timed(batch.phase is Phase.TRAIN, batch.step)):
                return decode_tensor(msg.activation,
                                     field=f"passive party {k} activation ({batch.phase.name} "
                                           f"step {batch.step})",
                                     dtype=self.wire,
                                     shape=(batch.sample_ids.size, *self.shapes[k]),
                                     finite=True).float()
        except CodecError as err:
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT, str(err), k) from None

    def _ack(self, k: int, msg: pb.PartyMessage | PartyGone, position: Position, during: str,
             late_answers: bool) -> pb.CheckpointAck | None:
        msg = self._check(k, msg, during)
        if not msg.HasField("checkpoint"):
            if late_answers and msg.HasField("activation"):
                return None  # the answer to the batch asked before this checkpoint
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"passive party {k} sent an activation for step {msg.step}, but "
                               f"{during} was asked", k)
        ack = msg.checkpoint
        if ack.step != position.step or len(ack.sha256) != 64:
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"passive party {k} acknowledged a checkpoint of step {ack.step} "
                               f"(SHA-256 {ack.sha256[:70]!r}), but the one of step "
                               f"{position.step} was asked", k)
        return ack
