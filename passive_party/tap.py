"""The tap: forwards every received cut gradient to the attacker sidecar, bounded and in order."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from splitleak.config import AttackerConfig, TopologyConfig
from splitleak.transport import create_channel
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import attacker_pb2_grpc as apb_grpc

log = logging.getLogger("passive_party")


class TapError(RuntimeError):
    """The sidecar is gone and the config says a run must not go on unobserved."""


class Tap:
    """A client stream of GradientRecords fed by a bounded queue (backpressure, no drops).

    If the sidecar fails: with on_sidecar_failure = "fail" the next record raises TapError;
    with "continue" records are counted as a gap and training goes on.
    """

    def __init__(self, address: str, attacker: AttackerConfig, topology: TopologyConfig,
                 tls_dir: Path | None = None, identity: str = "") -> None:
        self.address = address
        self.mode = attacker.on_sidecar_failure
        self.record_activation = attacker.record_activation
        self.queue: asyncio.Queue[apb.GradientRecord | None] = asyncio.Queue(attacker.queue_size)
        self.channel = create_channel(address, topology, tls_dir, identity)
        self.stub = apb_grpc.AttackerSidecarStub(self.channel)
        self.error: str | None = None
        self.sent = 0
        self.gap_records = 0
        self.gap_first_step: int | None = None
        self.summary: apb.RecordSummary | None = None
        self._call: asyncio.Task | None = None
        self.timeout = topology.join_deadline_s

    async def start(self) -> None:
        """Connect (within the join deadline) and open the Record stream."""
        try:
            await asyncio.wait_for(self.channel.channel_ready(), self.timeout)
        except TimeoutError:
            self.error = (f"attacker sidecar at {self.address} is not reachable "
                          f"(waited {self.timeout:g} s)")
            if self.mode == "fail":
                raise TapError(self.error) from None
            log.error("%s; going on unobserved (attacker.on_sidecar_failure = 'continue')",
                      self.error)
            return
        self._call = asyncio.ensure_future(self._stream())

    async def _records(self) -> AsyncIterator[apb.GradientRecord]:
        while (record := await self.queue.get()) is not None:
            self.sent += 1  # handed to gRPC; lost in transit if the sidecar dies now
            yield record

    async def _stream(self) -> None:
        try:
            self.summary = await self.stub.Record(self._records())
        except grpc.aio.AioRpcError as err:
            self.error = f"attacker sidecar at {self.address}: {err.code().name}: {err.details()}"
            log.error("%s", self.error)
            while not self.queue.empty():  # wake a producer blocked on a full queue
                if (record := self.queue.get_nowait()) is not None:
                    self._gap(record)

    def _gap(self, record: apb.GradientRecord) -> None:
        self.gap_records += 1
        if self.gap_first_step is None:
            self.gap_first_step = record.step

    async def record(self, record: apb.GradientRecord) -> None:
        if self.error is None:
            await self.queue.put(record)
            if self.error is None:
                return
        if self.mode == "fail":
            raise TapError(f"{self.error}; stopping because attacker.on_sidecar_failure = 'fail'")
        self._gap(record)

    async def close(self) -> dict:
        """Finish the stream and wait for the sidecar's acknowledgement."""
        if self.error is None:
            await self.queue.put(None)
        if self._call is not None:
            try:
                await asyncio.wait_for(self._call, self.timeout)
            except TimeoutError:
                self.error = f"attacker sidecar at {self.address} did not acknowledge in time"
        await self.channel.close()
        if self.error is not None and self.mode == "fail":
            raise TapError(self.error)
        return {"sent": self.sent, "acknowledged": self.summary.records if self.summary else 0,
                "gap_records": self.gap_records, "gap_first_step": self.gap_first_step,
                "error": self.error}
