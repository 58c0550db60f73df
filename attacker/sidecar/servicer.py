"""The AttackerSidecar gRPC service: decode each record, append it to its side's log,
acknowledge at the end. A stream is one (observer, party): a passive party's tap, or the
label party's tap of what it receives from that party."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import Any, Literal

import grpc
import numpy as np

from attacker.sidecar.store import GradientStore, RecordError
from splitleak.codec import CodecError, decode_ids, decode_tensor, decode_view
from splitleak.tap import REASON_CHARS
from splitleak.timing import WARMUP_STEPS, CpuWindow
from splitleak.tls import LABEL_PARTY, passive_identity, peer_identity
from splitleak.v1 import attacker_pb2 as pb
from splitleak.v1 import attacker_pb2_grpc as pb_grpc
from splitleak.v1 import tensor_pb2
from splitleak.wire import Malformed, RefusalLog, add_service, clip, echo

log = logging.getLogger("attacker")
_OPTIONAL: tuple[Literal["activation", "first_layer_gradient"], ...] = (
    "activation", "first_layer_gradient")
_TENSORS: tuple[Literal["sample_ids", "cut_gradient", "activation", "first_layer_gradient"], ...] = (
    "sample_ids", "cut_gradient", "activation", "first_layer_gradient")
_RECORDED = (tensor_pb2.FLOAT32, tensor_pb2.FLOAT16, tensor_pb2.BFLOAT16)  # [wire] dtypes
SYNC_TIMEOUT = 60.0  # s: a checkpoint Sync without a deadline waits at most this
DRAIN_S = 1.0  # s: what a refused stream may still send before its call is aborted
PASSIVE, LABEL = pb.PASSIVE_PARTY, pb.LABEL_PARTY
Key = tuple["pb.Observer.ValueType", int]  # (observer, passive party id)


def who(key: Key) -> str:
    """The stream's name in messages."""
    observer, k = key
    return f"passive party {k}" if observer == PASSIVE else f"the label party (receiving from party {k})"


async def _answer(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str,
                  requests: AsyncIterator[Any] | None = None) -> None:
    """End the call with a status: set, and the handler returns, which leaves nothing behind
    (each call ended by context.abort left about 1 KB in gRPC, so a sidecar fed refused
    streams grew without end). A stream is read to its end first (a client still sending when
    the call ends sees a failed write, not the status), for at most DRAIN_S, then aborted."""
    context.set_code(code)
    context.set_details(details)
    if requests is None:
        return
    try:
        await asyncio.wait_for(_drain(requests), DRAIN_S)
        return
    except TimeoutError:
        pass
    await _abort(context, code, details)


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """context.abort, its exception dropped at once (it kept two thirds of the growth alive)."""
    try:
        await context.abort(code, details)
    except grpc.aio.AbortError:
        pass


async def _drain(requests: AsyncIterator[Any]) -> None:
    async for _ in requests:
        pass


async def _closed_by_client(context: grpc.aio.ServicerContext) -> bool:
    """Whether the client closed its stream itself: gRPC ends the request iterator alike when
    the call broke (cancelled, or the client's process gone), but a broken call takes no
    headers (or gRPC cancels this handler meanwhile: CancelledError, a broken stream too)."""
    try:
        await context.send_initial_metadata(())
    except grpc.aio.BaseError:
        return False
    return True


def _one_line(text: str, limit: int) -> str:
    """A peer's free text for one line of our log: cut to `limit` characters (clip), its line
    breaks and other control characters made spaces."""
    return " ".join("".join(c if c.isprintable() else " " for c in clip(text, limit)).split())


def add_sidecar(server: grpc.aio.Server, servicer: AttackerServicer, limit_mb: int) -> None:
    add_service(server, pb_grpc.add_AttackerSidecarServicer_to_server, servicer, limit_mb)


def _received(tensor: tensor_pb2.Tensor, field: str, max_bytes: int) -> np.ndarray:
    """A recorded tensor as float32: dense float32 is viewed without a copy; a float16 /
    bfloat16 wire (`[wire] dtype`) is widened and a sparse one (`[wire] sparse`) expanded,
    both exactly, so the log holds what the party received. A sparse message expands to no
    more float32 bytes than a dense message may carry (`max_bytes`), checked before anything
    is allocated: a few bytes on the wire never claim more memory or disk than a message."""
    if tensor.dtype == tensor_pb2.FLOAT32 and not tensor.sparse:
        return decode_view(tensor, field=field, dtype=tensor_pb2.FLOAT32)
    return decode_tensor(tensor, field=field, dtype=_RECORDED,
                         max_elements=max_bytes // 4).float().numpy()


class AttackerServicer(pb_grpc.AttackerSidecarServicer):
    def __init__(self, store: GradientStore, observe: set[int], run_id: str | None = None,
                 tls: bool = False, received: GradientStore | None = None,
                 receive: set[int] | None = None,
                 shapes: dict[Key, dict[str, tuple[int, ...]]] | None = None,
                 config_hash: str | None = None, max_message_mb: int = 64) -> None:
        self.stores = {PASSIVE: store, **({LABEL: received} if received is not None else {})}
        self.tls = tls
        self.observe = observe
        self.receive = receive or set()
        self.expected: set[Key] = {(PASSIVE, k) for k in observe} | {(LABEL, k) for k in self.receive}
        self.run_id = run_id
        self.shapes = shapes  # per stream, each tensor's row shape from the config (if known)
        self.config_hash = config_hash  # the experiment's (if known): every stream must name it
        self.max_bytes = max_message_mb * 1024 * 1024  # what one dense message may carry
        self.finished: set[Key] = set()
        self.all_finished = asyncio.Event()
        self.streaming: set[Key] = set()
        self.broken: dict[Key, str] = {}  # expected streams that ended unclosed: how
        self.stopped: dict[Key, str] = {}  # of those, the ones whose party said why: its sentence
        self.gone: set[Key] = set()  # of those, the ones whose party will not open them again
        self.all_ended = asyncio.Event()  # every expected stream ended, one or more broken
        self.ended_at = 0.0  # the event loop's time when the last one ended
        self.refused: dict[Key, str] = {}  # the last refusal of each expected stream
        self.refusals = RefusalLog(log)
        self._appended = asyncio.Condition()
        self.cpu = CpuWindow()  # this process's CPU over the records of timed train steps
        self.timed_steps: dict[Key, int] = {}  # per stream: records of train steps past the warm-up

    @property
    def store(self) -> GradientStore:
        return self.stores[PASSIVE]

    def _refused(self, err: RecordError, key: Key | None) -> tuple[grpc.StatusCode, str]:
        """Log the refusal and its reason here (at a bounded rate); the status to answer."""
        self.refusals.refused(who(key) if key is not None else "a record stream", str(err),
                              err.status)
        if key in self.expected:
            self.refused[key] = str(err)
        return grpc.StatusCode[err.status], str(err)

    async def Record(self, request_iterator: AsyncIterator[pb.GradientRecord | Malformed],  # noqa: N802
                     context: grpc.aio.ServicerContext) -> pb.RecordSummary:
        records = rows = 0
        key: Key | None = None
        claimed: Key | None = None
        refusal: tuple[grpc.StatusCode, str] | None = None
        stop: pb.TapStop | None = None  # the stream's last record: why its party stops
        closed = False  # by its party (the stream did not break)
        try:
            async for record in request_iterator:
                if isinstance(record, Malformed):
                    raise RecordError(record.describe(), status=record.code.name)
                claimed = (record.observer, record.party_id)
                if key is None:
                    run_id = record.run_id
                    if not run_id and record.HasField("stopped"):  # its party stops before it
                        run_id = self.run_id or ""  # joined: it knows no run to name
                    key = self._admit(run_id, claimed, peer_identity(context),
                                      config_hash=record.config_hash)
                    self._opened(key)
                if stop is not None:
                    raise RecordError(f"{who(key)} sent a record after its stop (a stream's "
                                      "last record)")
                if record.HasField("stopped"):
                    stop = self._stop(record, key)
                    continue
                rows += self._append(record, key)
                records += 1
                if record.step >= WARMUP_STEPS:
                    self.cpu.mark()
                    self.timed_steps[key] = self.timed_steps.get(key, 0) + 1
                async with self._appended:
                    self._appended.notify_all()
            closed = key is None or await _closed_by_client(context)
        except RecordError as err:
            refusal = self._refused(err, key if key is not None else claimed)
        finally:  # also when gRPC cancels this handler: its stream broke
            if key is not None:
                self._ended(key, closed, refusal, stop)
        if refusal is not None and key is not None:  # a tap of this run: it must stop at once
            await _abort(context, *refusal)  # (a third of an abort's growth remains; see _answer)
            return pb.RecordSummary()
        if refusal is not None:
            await _answer(context, *refusal, requests=request_iterator)
            return pb.RecordSummary()
        return pb.RecordSummary(records=records, rows=rows) if closed else pb.RecordSummary()

    def _stop(self, record: pb.GradientRecord, key: Key) -> pb.TapStop:
        """A stop, checked as a record is: of the stream's party, and nothing else; its reason
        made one line of at most REASON_CHARS characters (a peer's text, in our last line)."""
        self._same_stream(record, key)
        carried = [name for name in _TENSORS if record.HasField(name)]
        if carried:
            raise RecordError(f"{who(key)}'s stop carries {carried[0]}; a stop carries only "
                              "why its party stops")
        reason = _one_line(record.stopped.reason, REASON_CHARS) or "(it gave no reason)"
        resumable = record.stopped.resumable
        log.warning("%s stopped before its run was done: %s (%s)", who(key), reason,
                    "stopped on its host: its stream may open again" if resumable else
                    "it failed: its stream is not waited for")
        return pb.TapStop(reason=reason, resumable=resumable)

    def _opened(self, key: Key) -> None:
        """An admitted stream: also one that broke before, opened again (a resumed tap)."""
        self.streaming.add(key)
        self.broken.pop(key, None)
        self.stopped.pop(key, None)
        self.gone.discard(key)
        self.all_ended.clear()

    def _ended(self, key: Key, closed: bool, refusal: tuple[grpc.StatusCode, str] | None,
               stop: pb.TapStop | None = None) -> None:
        """A stream of this run ended: closed by its party, refused, stopped (its party said
        why it ends before its run is done), or broken."""
        self.streaming.discard(key)
        if refusal is not None:
            self.broken[key] = f"was refused: {refusal[1]}"
        elif stop is not None:
            self.broken[key] = "was stopped by its party"
            self.stopped[key] = stop.reason
            if not stop.resumable:
                self.gone.add(key)
        elif not closed:
            self.broken[key] = "broke before it was closed"
        else:
            self.finished.add(key)
        if self.expected <= self.finished:
            for store in self.stores.values():
                store.close()
            self.all_finished.set()
        elif self.broken and self.expected <= self.finished | self.broken.keys():
            self.ended_at = asyncio.get_running_loop().time()
            self.all_ended.set()

    async def Sync(self, request: pb.SyncRequest,  # noqa: N802
                   context: grpc.aio.ServicerContext) -> pb.RecordSummary:
        claimed = (request.observer, request.party_id)
        refusal: tuple[grpc.StatusCode, str] | None = None
        try:
            key = self._admit(request.run_id, claimed, peer_identity(context),
                              streaming_ok=request.mode == pb.SyncRequest.CHECKPOINT,
                              config_hash=request.config_hash)
            store = self.stores[key[0]]
            if request.mode == pb.SyncRequest.CHECKPOINT:
                await self._wait_for(key, request.step, context.time_remaining())
                store.sync(key[1])
            elif request.mode == pb.SyncRequest.REWIND:
                store.rewind(key[1], request.step)
            else:
                raise RecordError(f"Sync mode {request.mode} is not one of CHECKPOINT, REWIND")
        except RecordError as err:
            refusal = self._refused(err, claimed)
        if refusal is not None:
            await _answer(context, *refusal)
            return pb.RecordSummary()
        records, rows = store.counts(key[1])
        return pb.RecordSummary(records=records, rows=rows)

    async def _wait_for(self, key: Key, step: int, remaining: float | None) -> None:
        """Until the stream's log holds its record of train step `step` - 1."""
        store, party = self.stores[key[0]], key[1]

        def arrived() -> bool:
            last = store.last_step(party)
            return step == 0 or (last is not None and last >= step - 1)

        timeout = min(remaining, SYNC_TIMEOUT) if remaining is not None else SYNC_TIMEOUT
        try:
            async with self._appended:
                await asyncio.wait_for(self._appended.wait_for(arrived), timeout)
        except TimeoutError:
            raise RecordError(f"{who(key)}: the record of step {step - 1} did not "
                              f"arrive within {timeout:g} s (last logged: step "
                              f"{store.last_step(party)})", status="DEADLINE_EXCEEDED") from None

    def _admit(self, run_id: str, key: Key, peer: str | None, streaming_ok: bool = False,
               config_hash: str = "") -> Key:
        observer, k = key
        if observer not in (PASSIVE, LABEL):
            raise RecordError(f"observer {observer} is not one of PASSIVE_PARTY, LABEL_PARTY")
        allowed = passive_identity(k) if observer == PASSIVE else LABEL_PARTY
        if self.tls and peer != allowed:
            raise RecordError(
                f"the client certificate names {echo(peer)}, which may not send the "
                f"records of {who(key)}", status="PERMISSION_DENIED")
        accepted = self.observe if observer == PASSIVE else self.receive
        if k not in accepted:
            side = ("passive party {k}" if observer == PASSIVE else
                    "the label party of what it receives from party {k}").format(k=k)
            listed = ", ".join(map(str, sorted(accepted))) or "none"
            raise RecordError(
                f"records from {side} are not accepted: this sidecar records "
                f"{'the taps of parties' if observer == PASSIVE else 'the label party on parties'} "
                f"{listed}", status="PERMISSION_DENIED")
        if self.run_id and run_id != self.run_id:
            raise RecordError(
                f"record of run {echo(run_id)}, but this sidecar records run "
                f"{self.run_id!r}: start it with --run-id set to the name of the label party's "
                "run directory", status="FAILED_PRECONDITION")
        if self.config_hash and config_hash != self.config_hash:
            named = f"the experiment of config hash {echo(config_hash)}" if config_hash else (
                "no experiment (its records carry no config hash)")
            raise RecordError(
                f"{who(key)} runs {named}, but this sidecar was started with the experiment "
                f"file of hash {self.config_hash!r}: give `attacker serve --config` the run's "
                "experiment file", status="FAILED_PRECONDITION")
        if key in self.streaming and not streaming_ok:
            raise RecordError(f"{who(key)} is already streaming its records to this "
                              "sidecar", status="ALREADY_EXISTS")
        if key in self.finished and not streaming_ok:
            raise RecordError(f"{who(key)} already streamed its records to this sidecar",
                              status="ALREADY_EXISTS")
        return key

    @staticmethod
    def _same_stream(record: pb.GradientRecord, key: Key) -> None:
        if (record.observer, record.party_id) != key:
            raise RecordError(f"a stream opened by {who(key)} carried a record of "
                              f"{who((record.observer, record.party_id))}")

    def _append(self, record: pb.GradientRecord, key: Key) -> int:
        observer, party = key
        self._same_stream(record, key)
        where = f"party {party} step {record.step}" + ("" if observer == PASSIVE else " (received)")
        try:
            if observer == PASSIVE:
                names = ["cut_gradient"] + [n for n in _OPTIONAL if record.HasField(n)]
            else:  # what the label party received: the activation and nothing else
                names = ["activation"]
                extra = [n for n in ("cut_gradient", "first_layer_gradient") if record.HasField(n)]
                if extra:
                    raise RecordError(f"{where}: the label party's record carries {extra[0]}; it "
                                      "records only the activation it received")
            ids = decode_ids(record.sample_ids, field=f"{where} sample_ids")
            for name in names:  # the declared shapes, before any tensor is decoded
                self._check_shape(list(getattr(record, name).shape), ids.size, key, where, name)
            arrays = {n: _received(getattr(record, n), f"{where} {n}", self.max_bytes)
                      for n in names}
        except CodecError as err:
            raise RecordError(str(err)) from None
        return self.stores[observer].append(party, record.epoch, record.step, ids, arrays)

    def _check_shape(self, dims: list[int], rows: int, key: Key, where: str, name: str) -> None:
        """A recorded tensor's declared shape: one row per sample id, some values per row, and
        the row shape the config gives (when the sidecar has it)."""
        if rows == 0:
            raise RecordError(f"{where}: empty record")
        field = f"{where} {name}"
        if len(dims) < 2 or dims[0] != rows:
            raise RecordError(f"{field}: shape {dims} does not match {rows} sample ids")
        if math.prod(dims[1:]) == 0:
            raise RecordError(f"{field}: shape {dims} has no values per row (a gradient of "
                              "width 0)")
        expected = (self.shapes or {}).get(key, {}).get(name)
        if expected is not None and tuple(dims[1:]) != expected:
            raise RecordError(f"{field}: rows of shape {dims[1:]}, but the shared config gives "
                              f"{who(key)}'s bottom model {list(expected)}")
