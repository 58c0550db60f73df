"""The tap: each record counted once (sent or a gap) when the sidecar fails, and tapped by the
passive party after it has answered the next batch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import pytest

from splitleak.codec import encode_tensor
from splitleak.config import AttackerConfig, TopologyConfig, parse_config
from splitleak.tap import Tap, TapError
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import split_learning_pb2 as pb
from tests.conftest import small_config


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
    assert report.error and "UNAVAILABLE" in report.error
    # What the reader took before the failure was sent (and lost in transit); what it took after
    # is a gap, like everything still queued.
    assert report.sent >= accept and sidecar.taken[:report.sent] == list(range(report.sent))
    assert report.sent + report.gap_records == 20
    assert report.gap_first_step == report.sent


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
    assert "stalled" in report.error
    assert (report.sent, report.gap_records, report.gap_first_step) == (0, 6, 0)


# --- where the passive party taps: after answering, except before a checkpoint or the end -----


class _ScriptedCall:
    """A Train call that plays the label party's messages and logs what the party does."""

    def __init__(self, messages: list[pb.LabelPartyMessage], events: list[str]) -> None:
        self.messages, self.events = messages, events

    async def read(self) -> pb.LabelPartyMessage:
        return self.messages.pop(0)

    async def write(self, message: pb.PartyMessage) -> None:
        self.events.append(f"answer {message.step}")

    async def done_writing(self) -> None:
        self.events.append("done")

    async def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.OK

    def cancel(self) -> None:
        pass

    def add_done_callback(self, callback: object) -> None:
        pass  # never ends before the party does


class _LoggingTap:
    record_activation = False

    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def record(self, record: apb.GradientRecord) -> None:
        self.events.append(f"tap {record.step}")


def test_the_party_taps_a_gradient_after_answering_the_next_batch(tmp_path: Path) -> None:
    from passive_party.client import StepLoop, load_bottom

    cfg = parse_config(small_config(tmp_path, features={"passive": [[0, 30]]},
                                    topology={"passive_parties": 1}))
    bottom = load_bottom(cfg, 1)
    rows = 4

    def batch(step: int) -> pb.Batch:
        return pb.Batch(phase=pb.TRAIN, step=step, sample_ids=encode_tensor(np.arange(rows)))

    def gradient(step: int, **more: object) -> pb.LabelPartyMessage:
        values = np.full((rows, *bottom.embedding_shape), 0.01, np.float32)
        return pb.LabelPartyMessage(cut_gradient=encode_tensor(values), gradient_step=step, **more)

    events: list[str] = []
    call = _ScriptedCall([pb.LabelPartyMessage(next_batch=batch(0)),
                          gradient(0, next_batch=batch(1)),
                          gradient(1, next_batch=batch(2)),
                          gradient(2, done=True)], events)
    asyncio.run(StepLoop(bottom, _LoggingTap(events), "r").run(call))
    # Step t's record goes out once batch t+1 is answered; the last one before the end.
    assert events == ["answer 0", "answer 1", "tap 0", "answer 2", "tap 1", "tap 2", "done"]


def test_a_sidecar_of_another_experiment_refuses_the_tap(tmp_path: Path) -> None:
    """A sidecar started with another experiment file of the same shapes recorded the run
    without a word (only --run-id pinned it). The tap now names its config's hash, and a
    sidecar with a config refuses a stream of another, naming both."""
    from tests.live import sidecar

    cfg = parse_config(small_config(tmp_path))
    other = parse_config(small_config(tmp_path, run={"seed": 1}))
    assert cfg.hash != other.hash

    async def go(sidecar_hash: str, tap_hash: str) -> tuple[Tap, apb.RecordSummary | None]:
        async with sidecar(tmp_path / f"{sidecar_hash}-{tap_hash}", config_hash=sidecar_hash) as (
                address, _):
            tap = Tap(address, AttackerConfig(on_sidecar_failure="continue"),
                      TopologyConfig(tls=False), config_hash=tap_hash)
            await tap.start("r1", 1)
            for step in range(3):
                await tap.record(apb.GradientRecord(
                    run_id="r1", party_id=1, epoch=0, step=step,
                    sample_ids=encode_tensor(np.arange(4)),
                    cut_gradient=encode_tensor(np.ones((4, 3), np.float32))))
            await tap.close()
            return tap, tap.summary

    tap, _ = asyncio.run(go(other.hash, cfg.hash))
    assert tap.error is not None and "FAILED_PRECONDITION" in tap.error, tap.error
    assert (f"passive party 1 runs the experiment of config hash '{cfg.hash}', but this sidecar "
            f"was started with the experiment file of hash '{other.hash}'") in tap.error
    assert "attacker serve --config" in tap.error
    tap, _ = asyncio.run(go(other.hash, ""))
    assert tap.error is not None and "carry no config hash" in tap.error, tap.error
    tap, summary = asyncio.run(go(cfg.hash, cfg.hash))
    assert tap.error is None and summary is not None and summary.records == 3


def test_a_sidecar_of_another_run_id_says_which_id_to_start_it_with(tmp_path: Path) -> None:
    """A sidecar started with a --run-id other than the label party's run directory's name
    refused the tap naming both ids, not what to do."""
    from tests.live import sidecar

    async def go() -> Tap:
        async with sidecar(tmp_path / "s", run_id="exp1") as (address, _):
            tap = Tap(address, AttackerConfig(on_sidecar_failure="continue"),
                      TopologyConfig(tls=False))
            await tap.start("exp2", 1)
            await tap.record(apb.GradientRecord(
                run_id="exp2", party_id=1, epoch=0, step=0, sample_ids=encode_tensor(np.arange(4)),
                cut_gradient=encode_tensor(np.ones((4, 3), np.float32))))
            await tap.close()
            return tap

    tap = asyncio.run(go())
    assert tap.error is not None and "FAILED_PRECONDITION" in tap.error, tap.error
    assert ("record of run 'exp2', but this sidecar records run 'exp1': start it with --run-id "
            "set to the name of the label party's run directory") in tap.error, tap.error


class SyncingSidecar(FailingSidecar):
    """Takes `accept` records, answers a checkpoint's Sync with its log's count (the records of
    earlier streams, `before`, and this stream's), then fails the stream."""

    def __init__(self, accept: int, before: int = 0) -> None:
        super().__init__(accept)
        self.before = before

    async def Sync(self, request, timeout):  # noqa: N802 (the gRPC method's name)
        return apb.RecordSummary(records=self.before + request.step)  # every step < step


@pytest.mark.parametrize(("before", "checkpoint"), [(0, True), (25, True), (0, False)])
def test_a_broken_stream_reports_what_its_last_checkpoint_found_logged(
        before: int, checkpoint: bool) -> None:
    """tap.json said "acknowledged": 0 when the sidecar died after durably logging 60 records;
    now the count of this stream's records the last checkpoint's Sync found logged, and None
    (not 0) when no Sync confirmed any."""
    async def run() -> dict:
        tap = Tap("127.0.0.1:9", AttackerConfig(on_sidecar_failure="continue", queue_size=1),
                  TopologyConfig(tls=False))
        sidecar = SyncingSidecar(accept=12, before=before)
        tap.stub = sidecar

        async def reached() -> None:
            return None

        tap._reach = reached  # type: ignore[method-assign]
        await tap.start("r1", 1, rewind_to=0 if before else None)
        for step in range(20):
            await tap.record(apb.GradientRecord(step=step))
            if step == 5 and checkpoint:
                assert await tap.sync(6) == before + 6
        return await tap.close()

    report = asyncio.run(run())
    assert report.error and "UNAVAILABLE" in report.error
    assert report.acknowledged == (6 if checkpoint else None), report
