"""A tap: forwards what one side of a party's link receives to the attacker sidecar, bounded and
in order (a passive party's received gradients; the label party's received activations)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitleak.artifacts.records import TapReport
from splitleak.config import AttackerConfig, TopologyConfig
from splitleak.tls import ATTACKER
from splitleak.transport import (
    CLOSED_IN_A_ROW,
    closed_unanswered,
    create_channel,
    own_certificate_refused,
    plaintext_against_tls,
    refused_server,
    tls_refusal,
)
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import attacker_pb2_grpc as apb_grpc

log = logging.getLogger("splitleak.tap")
SIDECAR = "attacker sidecar"
_RETRY = 0.2  # seconds between attempts to reach a sidecar that is not listening yet
STOP_S = 2.0  # s: what telling the sidecar why the party stops may take, at most
REASON_CHARS = 2000  # of the party's sentence sent with its stop


class TapError(RuntimeError):
    """The sidecar is gone and the config says a run must not go on unobserved."""


class Tap:
    """A client stream of GradientRecords fed by a bounded queue (backpressure, no drops).

    If the sidecar fails (ends the stream, or accepts no record for `stall_timeout` seconds):
    with on_sidecar_failure = "fail" the next record raises TapError; with "continue" records
    are counted as a gap and training goes on.
    """

    def __init__(self, address: str, attacker: AttackerConfig, topology: TopologyConfig,
                 tls_dir: Path | None = None, identity: str = "",
                 observer: apb.Observer.ValueType = apb.PASSIVE_PARTY, config_hash: str = "") -> None:
        self.address = address
        self.config_hash = config_hash  # the experiment's: a sidecar of another one refuses
        self.observer = observer  # which side of the link records (attacker.proto's Observer)
        self.mode = attacker.on_sidecar_failure
        self.record_activation = attacker.record_activation
        self.queue: asyncio.Queue[apb.GradientRecord | None] = asyncio.Queue(attacker.queue_size)
        # Who this side is, to name its certificate when the sidecar refuses it
        self.tls_dir, self.identity = tls_dir, identity
        self.channel = create_channel(address, topology, tls_dir, identity,
                                      server_identity=ATTACKER)
        self.stub = apb_grpc.AttackerSidecarStub(self.channel)
        self.error: str | None = None
        self.sent = 0
        self.gap_records = 0
        self.gap_first_step: int | None = None
        self.summary: apb.RecordSummary | None = None
        self.logged_before = 0  # the party's records the sidecar's log kept from before (a resume)
        self.durable: int | None = None  # this stream's records the last checkpoint found logged
        self._call: asyncio.Task | None = None
        self.timeout = topology.join_deadline_s
        # Less than the label party's step deadline: the party names a stalled sidecar before
        # the label party would blame the party for the silence.
        self.stall_timeout = topology.step_deadline_s / 2
        self.run_id = ""
        self.party_id = 0
        self.stopping: apb.GradientRecord | None = None  # the stream's last record (stop)

    async def start(self, run_id: str, party_id: int, rewind_to: int | None = None) -> None:
        """Connect (within the join deadline), cut the log back to `rewind_to` (a resumed
        run), and open the Record stream."""
        self.run_id, self.party_id = run_id, party_id
        unreachable = await self._reach()
        if unreachable is not None:
            self._failed(unreachable)
            return
        if rewind_to is not None:
            kept = await self._sync(apb.SyncRequest.REWIND, rewind_to)
            if kept is not None:
                self.logged_before = kept
                log.info("the sidecar's log of party %d was cut back to step %d (%d records)",
                         party_id, rewind_to, kept)
        if self.error is None:
            self._call = asyncio.ensure_future(self._stream())

    async def _reach(self) -> str | None:
        """Why the sidecar cannot be reached within the join deadline, or None once it answers.
        Until it listens every call fails at once (try again); a TLS handshake that refused it
        (e.g. another role's certificate at that address), or a TLS sidecar closing this
        plaintext tap's connections, cannot get better by waiting."""
        health = health_pb2_grpc.HealthStub(self.channel)
        end = time.monotonic() + self.timeout
        closed = 0  # attempts in a row whose connection closed unanswered
        waiting = False
        while True:
            try:
                await health.Check(health_pb2.HealthCheckRequest(),
                                   timeout=max(0.001, end - time.monotonic()))
                return None
            except grpc.aio.AioRpcError as err:
                refusal = tls_refusal(err)
                if refusal is not None:
                    return refused_server(refusal, SIDECAR, self.address, "--attacker",
                                          self.tls_dir)
                closed = closed + 1 if closed_unanswered(err) else 0
                if closed >= CLOSED_IN_A_ROW:  # a TLS sidecar closed every connection
                    return (plaintext_against_tls(SIDECAR, self.address) if self.tls_dir is None
                            else own_certificate_refused(SIDECAR, self.address, self.tls_dir,
                                                         self.identity))
                if err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED):
                    return None  # it answered (e.g. no health service): the channel is up
                if time.monotonic() + _RETRY > end:
                    return f"{SIDECAR} at {self.address} is not reachable (waited {self.timeout:g} s)"
                if not waiting:  # one line: a sidecar not started yet otherwise looked like a hang
                    log.info("waiting up to %g s (topology.join_deadline_s) for the %s at %s to "
                             "answer", self.timeout, SIDECAR, self.address)
                    waiting = True
            await asyncio.sleep(_RETRY)

    def _failed(self, error: str) -> None:
        self.error = error
        if self.mode == "fail":
            raise TapError(error)
        log.error("%s; going on unobserved (attacker.on_sidecar_failure = 'continue')", error)

    async def _sync(self, mode: apb.SyncRequest.Mode.ValueType, step: int) -> int | None:
        """The sidecar's record count after a Sync, or None (and the error handled). With
        on_sidecar_failure = "fail", a sidecar already gone raises TapError: records may have been
        lost in flight, so no checkpoint may claim the log durable (a resume then starts from
        the last one that could)."""
        what = "checkpoint" if mode == apb.SyncRequest.CHECKPOINT else "rewind"
        if self.error is not None:
            if self.mode == "fail":
                raise TapError(f"{self.error}; no {what} at step {step}: the gradient log may "
                               "miss records in flight")
            return None
        request = apb.SyncRequest(run_id=self.run_id, party_id=self.party_id, step=step, mode=mode,
                                  observer=self.observer, config_hash=self.config_hash)
        try:
            reply = await self.stub.Sync(request, timeout=self.stall_timeout)
        except grpc.aio.AioRpcError as err:
            self._failed(f"{SIDECAR} at {self.address} failed the {what} at step {step}: "
                         f"{err.code().name}: {err.details()}")
            return None
        return int(reply.records)

    async def sync(self, step: int) -> int:
        """Wait until the sidecar holds every record of steps < `step` durably; its count
        (0 when the run goes on unobserved)."""
        count = await self._sync(apb.SyncRequest.CHECKPOINT, step)
        if count is not None:
            self.durable = count - self.logged_before
        return count or 0

    @property
    def acknowledged(self) -> int | None:
        """This stream's records the sidecar confirmed: every one it took, when the stream
        closed; after a break, those the last checkpoint's Sync found logged (None: none)."""
        return self.summary.records if self.summary is not None else self.durable

    async def _records(self) -> AsyncIterator[apb.GradientRecord]:
        first = True  # the record the sidecar admits the stream by: it names the experiment
        while (record := await self.queue.get()) is not None:
            if self.error is not None:  # grpc may read on after the call failed
                self._gap(record)
                self._drain()
                return
            self.sent += 1  # handed to gRPC; lost in transit if the sidecar dies now
            if first:
                record.config_hash, first = self.config_hash, False
            yield record
        if self.stopping is not None and self.error is None:  # after every record: why it ends
            if first:  # it opens the stream: it names the experiment
                self.stopping.config_hash = self.config_hash
            yield self.stopping

    async def _stream(self) -> None:
        try:
            self.summary = await self.stub.Record(self._records())
        except grpc.aio.AioRpcError as err:
            self.error = f"{SIDECAR} at {self.address}: {err.code().name}: {err.details()}"
            log.error("%s", self.error)
            self._drain()

    def _drain(self) -> None:
        while not self.queue.empty():  # wake a producer blocked on a full queue
            if (record := self.queue.get_nowait()) is not None:
                self._gap(record)

    def _gap(self, record: apb.GradientRecord) -> None:
        self.gap_records += 1
        if self.gap_first_step is None:
            self.gap_first_step = record.step

    async def record(self, record: apb.GradientRecord) -> None:
        """Queue one record, or count it as a gap once the sidecar has failed. Every record is
        counted once: as sent when the stream takes it before a failure, else as a gap."""
        queued = False
        if self.error is None:
            try:
                await asyncio.wait_for(self.queue.put(record), self.stall_timeout)
                queued = True
            except TimeoutError:
                self.error = (f"{SIDECAR} at {self.address} accepted no gradient record for "
                              f"{self.stall_timeout:g} s (stalled, or its disk is too slow)")
                log.error("%s", self.error)
                if self._call is not None:
                    self._call.cancel()
            if self.error is None:
                return
            self._drain()  # the call failed while this record waited: it may sit in the queue
        if self.mode == "fail":
            raise TapError(f"{self.error}; stopping because attacker.on_sidecar_failure = 'fail'")
        if not queued:
            self._gap(record)

    async def stop(self, reason: str, resumable: bool = False) -> None:
        """Tell the sidecar why the party stops before its run is done, after the records still
        queued, and close the stream; best-effort within STOP_S: a sidecar gone or slow leaves
        the stream cut off, and nothing is raised (the party's own failure is what it reports).
        `resumable`: a stop requested on its host, the run to be resumed from a checkpoint.
        A party that stops before its stream was opened (it never joined, or failed before its
        tap started) opens it for the stop alone, so the sidecar need not wait for it."""
        if self._call is None and self.error is None and self.party_id:
            self._call = asyncio.ensure_future(self._stream())
        call = self._call
        try:
            if call is not None and not call.done() and self.error is None:
                self.stopping = apb.GradientRecord(
                    run_id=self.run_id, party_id=self.party_id, observer=self.observer,
                    stopped=apb.TapStop(reason=reason[:REASON_CHARS], resumable=resumable))
                end = time.monotonic() + STOP_S
                try:
                    await asyncio.wait_for(self.queue.put(None), STOP_S)
                except TimeoutError:
                    pass
                await asyncio.wait({call}, timeout=max(0.0, end - time.monotonic()))
        finally:  # also when the stop itself is cancelled (a second signal): nothing left open
            if call is not None and not call.done():
                self.error = self.error or (f"{SIDECAR} at {self.address} did not take the "
                                            f"party's stop within {STOP_S:g} s")
                log.warning("%s", self.error)
                call.cancel()
                self._drain()
            await self.channel.close()

    async def close(self) -> TapReport:
        """Finish the stream and wait for the sidecar's acknowledgement."""
        if self.error is None:
            try:
                await asyncio.wait_for(self.queue.put(None), self.stall_timeout)
            except TimeoutError:
                self.error = f"{SIDECAR} at {self.address} stopped accepting records"
                if self._call is not None:
                    self._call.cancel()
        if self._call is not None:
            try:
                await asyncio.wait_for(self._call, self.timeout)
            except TimeoutError:
                self.error = f"{SIDECAR} at {self.address} did not acknowledge in time"
            except asyncio.CancelledError:
                pass
        await self.channel.close()
        if self.error is not None and self.mode == "fail":
            raise TapError(self.error)
        return TapReport(sent=self.sent, acknowledged=self.acknowledged,
                         gap_records=self.gap_records, gap_first_step=self.gap_first_step,
                         error=self.error)
