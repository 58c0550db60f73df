"""A party that stops before its run is done tells the sidecar why on its Record stream (the
stream's last record), and closes it: the sidecar ends naming the party and its reason, at once
when the party failed, and awaits a party stopped to be resumed. A sidecar gone or
hung changes nothing of the party's own failure."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from attacker.sidecar.server import _unfinished
from attacker.sidecar.servicer import LABEL, PASSIVE, AttackerServicer
from passive_party.client import PartyError
from splitleak.cli_common import EXIT_PARTY_STOPPED
from splitleak.codec import encode_tensor
from splitleak.config import AttackerConfig, TopologyConfig, parse_config
from splitleak.tap import REASON_CHARS, STOP_S, Tap
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import attacker_pb2_grpc as apb_grpc
from tests import live
from tests.conftest import scaled, small_config
from tests.test_checkpoints import fresh_run
from tests.test_received_tap import _victim_config
from tests.test_sidecar import _logged_steps, _record, _start_sidecar


def _tap(address: str, mode: str = "fail", **topology: float) -> Tap:
    return Tap(address, AttackerConfig(on_sidecar_failure=mode, queue_size=4),
               TopologyConfig(tls=False, **topology))


async def _stream_then_stop(address: str, steps: range, reason: str, resumable: bool) -> Tap:
    tap = _tap(address)
    await tap.start("r1", 1)
    for step in steps:
        await tap.record(_record(1, step))
    await tap.stop(reason, resumable)
    return tap


def _stop(reason: str, resumable: bool = False, **fields: object) -> apb.GradientRecord:
    return apb.GradientRecord(run_id="r1", party_id=1, **fields,
                              stopped=apb.TapStop(reason=reason, resumable=resumable))


def test_a_party_that_will_not_come_back_has_the_sidecar_end_naming_its_reason(
        tmp_path: Path) -> None:
    """Before, the sidecar saw only a broken stream and said so after a 5 s grace; now its last
    line is the party's own sentence, and it does not wait for a party that said it is gone."""
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--run-id", "r1")
    reason = "the label party ended the stream with ABORTED: passive party 2 stopped"
    try:
        tap = asyncio.run(_stream_then_stop(address, range(3), reason, resumable=False))
        out, _ = proc.communicate(timeout=scaled(60))
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == EXIT_PARTY_STOPPED, out
    last = out.strip().splitlines()[-1]
    assert last.endswith("stopped before passive party 1 finished streaming: passive party 1 "
                         f"stopped: {reason}"), out
    assert (f"passive party 1 stopped before its run was done: {reason} (it failed: its stream "
            "is not waited for)") in out
    assert "broke before" not in out
    # What it sent stays recorded and acknowledged; the stop is no record
    assert (tap.sent, tap.gap_records, tap.error) == (3, 0, None)
    assert tap.summary is not None and tap.summary.records == 3
    assert _logged_steps(tmp_path / "run") == [0, 1, 2]


def test_a_party_stopped_to_be_resumed_is_awaited_and_recorded_when_it_comes_back(
        tmp_path: Path) -> None:
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--run-id", "r1")
    reason = "interrupted on its host by SIGTERM"

    async def stop_then_resume() -> Tap:
        await _stream_then_stop(address, range(3), reason, resumable=True)
        tap = _tap(address)
        await tap.start("r1", 1, rewind_to=2)  # the resumed party: its checkpoint was at step 2
        for step in range(2, 5):
            await tap.record(_record(1, step))
        await tap.close()
        return tap

    try:
        resumed = asyncio.run(stop_then_resume())
        out, _ = proc.communicate(timeout=scaled(30))
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, out
    assert (f"passive party 1 stopped before its run was done: {reason} (stopped on its host: its "
            "stream may open again)") in out
    assert resumed.summary is not None and resumed.summary.records == 3
    assert _logged_steps(tmp_path / "run") == list(range(5))


def test_a_run_that_fails_has_each_tapped_side_tell_the_sidecar_its_own_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The label party is stopped mid-run: it stops its own tap to be resumed, with its reason;
    the tapped passive party, failed by that stop, says so in its own words (the sentence it
    raises and logs), failed: it did not stop on its own host. Before, the label party closed its stream as if
    the run were done, and the passive party's broke."""
    servicers: list[AttackerServicer] = []
    sidecar = live.sidecar

    @contextlib.asynccontextmanager
    async def kept(*args: object, **kwargs: object) -> AsyncIterator[tuple[str, AttackerServicer]]:
        async with sidecar(*args, **kwargs) as (address, servicer):  # type: ignore[arg-type]
            servicers.append(servicer)
            yield address, servicer

    monkeypatch.setattr(live, "sidecar", kept)
    cfg = _victim_config(tmp_path)
    run = fresh_run(cfg, tmp_path / "run")
    outcome, errors = asyncio.run(live.whole_run(cfg, run.root, interrupt_at=8))
    assert outcome["status"] == "interrupted" and isinstance(errors[0], PartyError), (outcome, errors)
    servicer = servicers[0]
    assert servicer.stopped == {(PASSIVE, 1): str(errors[0]), (LABEL, 1): outcome["message"]}
    assert servicer.gone == {(PASSIVE, 1)}  # the label party stopped to be resumed
    assert (f"passive party 1 stopped: {errors[0]}; the label party (receiving from party 1) "
            f"stopped: {outcome['message']}") in _unfinished(servicer, sorted(servicer.expected))
    assert not servicer.finished  # neither stream counts as a finished run


class HungSidecar(apb_grpc.AttackerSidecarServicer):
    """Takes the call and every record, answers checkpoints, and never ends a Record call."""

    def __init__(self) -> None:
        self.stops: list[str] = []  # the reasons it was told

    async def Record(self, requests, context):  # noqa: N802 (the gRPC method's name)
        async for record in requests:
            if record.HasField("stopped"):
                self.stops.append(record.stopped.reason)
        await asyncio.Event().wait()

    async def Sync(self, request, context):  # noqa: N802
        return apb.RecordSummary()


@contextlib.asynccontextmanager
async def _hung() -> AsyncIterator[tuple[str, HungSidecar]]:
    servicer = HungSidecar()
    async with live.served(lambda server: apb_grpc.add_AttackerSidecarServicer_to_server(
            servicer, server)) as address:
        yield address, servicer


@pytest.mark.parametrize("mode", ["fail", "continue"])
def test_stopping_against_a_hung_sidecar_is_bounded_and_raises_nothing(mode: str) -> None:
    async def go() -> tuple[Tap, float]:
        async with _hung() as (address, _):
            tap = _tap(address, mode)
            await tap.start("r1", 1)
            for step in range(3):
                await tap.record(_record(1, step))
            began = time.monotonic()
            await tap.stop("passive party 1 failed", resumable=False)
            return tap, time.monotonic() - began

    tap, took = asyncio.run(go())
    assert took < STOP_S + scaled(2), took
    assert tap.error is not None and f"did not take the party's stop within {STOP_S:g} s" in tap.error
    assert tap.sent + tap.gap_records == 3


def test_stopping_with_no_sidecar_left_is_bounded_and_raises_nothing(tmp_path: Path) -> None:
    """Never reached (nothing listens), and gone in mid-stream (its server stopped)."""
    async def unreachable() -> tuple[Tap, float]:
        tap = Tap("127.0.0.1:9", AttackerConfig(on_sidecar_failure="continue"),
                  TopologyConfig(tls=False, join_deadline_s=0.5))
        await tap.start("r1", 1)
        began = time.monotonic()
        await tap.stop("passive party 1 failed", resumable=False)
        return tap, time.monotonic() - began

    async def gone() -> tuple[Tap, float]:
        async with live.sidecar(tmp_path) as (address, _):
            tap = _tap(address, "fail")
            await tap.start("r1", 1)
            await tap.record(_record(1, 0))
        began = time.monotonic()
        await tap.stop("passive party 1 failed", resumable=False)
        return tap, time.monotonic() - began

    tap, took = asyncio.run(unreachable())
    assert took < 1.0 and tap.error is not None and "not reachable" in tap.error, (took, tap.error)
    tap, took = asyncio.run(gone())
    assert took < STOP_S + scaled(2) and tap.sent + tap.gap_records == 1, (took, tap.error)


def test_a_party_fails_as_before_when_its_sidecar_hangs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The label party is stopped mid-run: the tapped party fails with the same error as the
    untapped one, whose sidecar never ends its call, within STOP_S of it."""
    servicers: list[HungSidecar] = []

    @contextlib.asynccontextmanager
    async def hung(*args: object, **kwargs: object) -> AsyncIterator[tuple[str, HungSidecar]]:
        async with _hung() as (address, servicer):
            servicers.append(servicer)
            yield address, servicer

    monkeypatch.setattr(live, "sidecar", hung)
    cfg = parse_config(small_config(
        tmp_path, training={"batch_size": 16, "epochs": 1, "eval_interval": 7,
                            "checkpoint_every": 5},
        threat={"parties": {"1": {"curious": True}}}))
    run = fresh_run(cfg, tmp_path / "run")
    ended: dict[int, float] = {}
    from passive_party import client

    party = client.run_party

    async def timed_party(cfg, k, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            await party(cfg, k, *args, **kwargs)
        finally:
            ended[k] = time.monotonic()

    monkeypatch.setattr(client, "run_party", timed_party)
    outcome, errors = asyncio.run(live.whole_run(cfg, run.root, interrupt_at=3))
    assert outcome["status"] == "interrupted", outcome
    assert all(isinstance(e, PartyError) for e in errors), errors
    assert str(errors[0]).replace("party 1", "party k") == str(errors[1]).replace("party 2",
                                                                                 "party k")
    assert ended[1] - ended[2] < STOP_S + scaled(2), ended
    assert servicers[0].stops == [str(errors[0])]  # it was told, and did not answer


@pytest.mark.parametrize("damage", ["oversize", "control characters", "empty"])
def test_a_stops_reason_is_one_bounded_line(tmp_path: Path, damage: str) -> None:
    reason = {"oversize": "x" * 1_000_000, "control characters": "disk\nfull\x1b[2J\r\tnow",
              "empty": ""}[damage]

    async def go() -> tuple[apb.RecordSummary, AttackerServicer]:
        async with live.sidecar(tmp_path) as (address, servicer):
            summary = await live.record_stream(address, [_record(1, 0), _stop(reason)])
            return summary, servicer

    summary, servicer = asyncio.run(go())
    assert summary.records == 1
    kept = servicer.stopped[(PASSIVE, 1)]
    assert len(kept) <= REASON_CHARS + 30 and kept.isprintable(), kept[:100]
    assert kept == {"oversize": f"{'x' * (REASON_CHARS - 1)}… (1000000 characters)",
                    "control characters": "disk full [2J now",
                    "empty": "(it gave no reason)"}[damage]
    assert "passive party 1 stopped: " + kept in _unfinished(servicer, [(PASSIVE, 1)])


@pytest.mark.parametrize("stream,refusal", [
    ([_stop("x", cut_gradient=encode_tensor(np.ones((4, 3), np.float32)))],
     "passive party 1's stop carries cut_gradient; a stop carries only why its party stops"),
    ([_record(1, 0), _stop("x"), _record(1, 1)],
     "passive party 1 sent a record after its stop (a stream's last record)"),
    ([_record(1, 0), apb.GradientRecord(run_id="r1", party_id=2, stopped=apb.TapStop(reason="x"))],
     "a stream opened by passive party 1 carried a record of passive party 2"),
    ([apb.GradientRecord(run_id="other", party_id=1, stopped=apb.TapStop(reason="x"))],
     "record of run 'other', but this sidecar records run 'r1'"),
])
def test_a_stop_is_checked_as_a_record_is(tmp_path: Path, stream: list, refusal: str) -> None:
    async def go() -> grpc.aio.AioRpcError:
        async with live.sidecar(tmp_path, observe=frozenset({1, 2})) as (address, _):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await live.record_stream(address, stream)
            return err.value

    err = asyncio.run(go())
    assert refusal in (err.details() or ""), err.details()
    assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)


def test_a_stop_before_any_record_names_the_experiment(tmp_path: Path) -> None:
    """A party that fails before its first record still opens its stream with the stop, which
    then carries the config hash a sidecar started with a config checks."""
    async def go() -> tuple[Tap, AttackerServicer]:
        async with live.sidecar(tmp_path, config_hash="h1") as (address, servicer):
            tap = Tap(address, AttackerConfig(), TopologyConfig(tls=False), config_hash="h1")
            await tap.start("r1", 1)
            await tap.stop("cannot write run/passive_party_1: No space left on device", False)
            return tap, servicer

    tap, servicer = asyncio.run(go())
    assert tap.error is None and tap.summary is not None and tap.summary.records == 0
    assert servicer.stopped == {
        (PASSIVE, 1): "cannot write run/passive_party_1: No space left on device"}


def test_a_party_stopped_by_sigterm_tells_its_sidecar_and_still_dies_of_it(tmp_path: Path) -> None:
    """Real processes: the party's exit is as before (killed by SIGTERM, the label party told);
    the sidecar, told too, awaits it to be resumed, then ends with its reason (before: 'the
    Record stream of passive party 1 broke before it was closed')."""
    import signal

    from tests.test_end_process import stop_party_in_training

    sidecar, address = _start_sidecar(tmp_path / "sidecar", "--party", "1", "--run-id", "run")
    data = small_config(tmp_path, training={"epochs": 400, "eval_interval": 0},
                        topology={"join_deadline_s": scaled(60)})  # party 1 is tapped
    try:
        ended, err, returncode = stop_party_in_training(tmp_path, data, signal.SIGTERM,
                                                        "--attacker", address)
        out, _ = sidecar.communicate(timeout=scaled(30))
    finally:
        sidecar.kill()
        sidecar.wait()
    reason = "interrupted on its host by SIGTERM"
    assert ended["message"] == f"passive party 1 stopped: {reason}", ended
    assert returncode == -signal.SIGTERM, err
    assert "passive party 1: stopped by SIGTERM; the label party was told" in err, err
    assert sidecar.returncode == EXIT_PARTY_STOPPED, out
    assert (f"passive party 1 stopped before its run was done: {reason} (stopped on its host: its "
            "stream may open again)") in out
    assert out.strip().splitlines()[-1].endswith(
        f"stopped before passive party 1 finished streaming: passive party 1 stopped: {reason}"), out
    steps = _logged_steps(tmp_path / "sidecar" / "run")
    assert steps == list(range(len(steps))) and len(steps) >= 3  # what it sent, kept in order


def test_a_party_that_fails_before_its_tap_started_has_the_sidecar_end_with_its_reason(
        tmp_path: Path) -> None:
    """A party that failed before its tap opened its Record stream (the label party's address,
    its data, its Join) left the sidecar waiting 2 x join_deadline_s (240 s by default), then
    saying only that the party 'never opened a Record stream'. The party now opens the stream
    for its stop alone (it knows no run id yet), and the sidecar ends at once with its reason."""
    from passive_party.client import run_party
    from splitleak.artifacts.paths import RunDir

    cfg = parse_config(small_config(tmp_path, topology={"join_deadline_s": 1}))
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--run-id", "r1")
    started = time.monotonic()
    try:
        run = RunDir(tmp_path / "party1")
        run.root.mkdir()
        with pytest.raises(PartyError, match="label party") as err:
            asyncio.run(run_party(cfg, 1, f"@{tmp_path / 'never-written'}", run, attacker=address))
        out, _ = proc.communicate(timeout=scaled(30))
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == EXIT_PARTY_STOPPED, out
    assert time.monotonic() - started < scaled(30), out
    last = out.strip().splitlines()[-1]
    reason = " ".join(str(err.value).split())[:REASON_CHARS]
    assert "stopped before passive party 1 finished streaming: passive party 1 stopped: " in last, out
    assert reason[:60] in last, (reason, out)
    assert "never opened a Record stream" not in out, out
