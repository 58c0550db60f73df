"""The tap's accounting when the sidecar's call fails: each record is sent or a gap, once."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from splitleak.config import AttackerConfig, TopologyConfig
from splitleak.tap import Tap, TapError
from splitleak.v1 import attacker_pb2 as apb


class FailingSidecar:
    """Takes `accept` records, then fails the call while its request reader reads on (grpc.aio's
    reader is a task of its own and may outlive the call by a few records)."""

    def __init__(self, accept: int) -> None:
        self.accept = accept
        self.taken: list[int] = []
        self.reader: asyncio.Task | None = None

    async def Record(self, requests):  # noqa: N802 (the gRPC method's name)
        it = requests.__aiter__()
        for _ in range(self.accept):
            self.taken.append((await it.__anext__()).step)
        self.reader = asyncio.ensure_future(self._read_on(it))
        await asyncio.sleep(0)
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                   grpc.aio.Metadata(), details="Connection reset by peer")

    async def _read_on(self, it) -> None:
        async for record in it:
            self.taken.append(record.step)


@pytest.mark.parametrize("queue_size", [1, 2, 4])
@pytest.mark.parametrize("accept", [0, 1, 3])
def test_every_record_is_counted_once_when_the_sidecar_fails(queue_size: int, accept: int) -> None:
    async def run() -> tuple[dict, FailingSidecar]:
        tap = Tap("127.0.0.1:9", AttackerConfig(on_sidecar_failure="continue", queue_size=queue_size),
                  TopologyConfig(tls=False))
        sidecar = FailingSidecar(accept)
        tap.stub = sidecar
        tap._call = asyncio.ensure_future(tap._stream())
        for step in range(20):
            await tap.record(apb.GradientRecord(step=step))
        return await tap.close(), sidecar

    report, sidecar = asyncio.run(run())
    assert report["error"] and "UNAVAILABLE" in report["error"]
    # What the reader took before the failure was sent (and lost in transit); what it took after
    # is a gap, like everything still queued.
    assert report["sent"] >= accept and sidecar.taken[:report["sent"]] == list(range(report["sent"]))
    assert report["sent"] + report["gap_records"] == 20
    assert report["gap_first_step"] == report["sent"]


class StalledSidecar:
    """Accepts the call and reads nothing."""

    async def Record(self, requests):  # noqa: N802 (the gRPC method's name)
        await asyncio.Event().wait()


@pytest.mark.parametrize("mode", ["fail", "continue"])
def test_a_stalled_sidecar_turns_the_queue_into_a_gap(mode: str) -> None:
    async def run() -> dict:
        tap = Tap("127.0.0.1:9", AttackerConfig(on_sidecar_failure=mode, queue_size=2),
                  TopologyConfig(tls=False, step_deadline_s=0.2))
        tap.stub = StalledSidecar()
        tap._call = asyncio.ensure_future(tap._stream())
        for step in range(6):
            await tap.record(apb.GradientRecord(step=step))
        return await tap.close()

    if mode == "fail":
        with pytest.raises(TapError, match="accepted no gradient record for 0.1 s"):
            asyncio.run(run())
        return
    report = asyncio.run(run())
    assert "stalled" in report["error"]
    assert (report["sent"], report["gap_records"], report["gap_first_step"]) == (0, 6, 0)
