"""The gradient log end to end: what the tap sends is what the sidecar keeps, a killed
sidecar loses at most its last record, and foreign records are refused (each record's shape
from the config, refusals logged at a bounded rate, no memory kept per refused stream)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow.parquet as pq
import pytest

from attacker.analysis.analyze import analyze
from attacker.sidecar.store import (
    INDEX,
    GradientLog,
    GradientStore,
    LogFormatError,
    RecordError,
    _prefix,
)
from orchestration.reference import run_reference
from splitleak.artifacts.metrics import read_metrics
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.codec import encode_ids, encode_tensor
from splitleak.config import parse_config
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import attacker_pb2_grpc as apb_grpc
from tests.conftest import scaled, small_config, write_config


def _store_batches(root: Path, steps: int, rows: int = 6, dim: int = 4,
                   shard_bytes: int = 600) -> list[np.ndarray]:
    store = GradientStore(root, "run-x", shard_bytes=shard_bytes)  # tiny shards: rotation is exercised
    written = []
    rng = np.random.default_rng(0)
    for step in range(steps):
        g = rng.normal(size=(rows, dim)).astype(np.float32)
        store.append(1, step // 3, step, np.arange(rows) + step * rows, {"cut_gradient": g})
        written.append(g)
    store.close()
    return written


def test_log_round_trips_across_shards(tmp_path: Path) -> None:
    written = _store_batches(tmp_path / "g", steps=7)
    log = GradientLog(tmp_path / "g")
    batches = list(log.batches(1))
    assert len(list((tmp_path / "g" / "party_1").glob("shard-*"))) > 1
    assert [b.step for b in batches] == list(range(7)) and batches[4].epoch == 1
    for b, g in zip(batches, written, strict=True):
        np.testing.assert_array_equal(b.tensors["cut_gradient"], g)
    assert log.warnings == [] and log.run_id == "run-x"


def test_torn_tail_is_warned_and_complete_records_survive(tmp_path: Path) -> None:
    written = _store_batches(tmp_path / "g", steps=3)
    shard = sorted((tmp_path / "g" / "party_1").glob("shard-*"))[-1]
    shard.write_bytes(shard.read_bytes()[:-40])  # a crash in the middle of the last record
    log = GradientLog(tmp_path / "g")
    batches = list(log.batches(1))
    assert [b.step for b in batches] == [0, 1]
    np.testing.assert_array_equal(batches[1].tensors["cut_gradient"], written[1])
    assert len(log.warnings) == 1 and "torn tail" in log.warnings[0]
    assert f"{shard}: unreadable after 0 complete record(s)" in log.warnings[0]  # its own
    list(log.batches(1))  # read again (a party alone, then in a group): still one warning
    assert len(log.warnings) == 1


def test_a_record_of_nan_gradients_is_left_out_by_shard_party_and_step(tmp_path: Path) -> None:
    written = _store_batches(tmp_path / "g", steps=3, shard_bytes=1 << 20)
    shard = tmp_path / "g" / "party_1" / "shard-000000.arrows"
    data = bytearray(shard.read_bytes())
    at = bytes(data).index(written[1][0].tobytes())  # step 1's first gradient row
    data[at:at + 16] = b"\xff" * 16  # NaN
    shard.write_bytes(bytes(data))
    log = GradientLog(tmp_path / "g")
    assert [b.step for b in log.batches(1)] == [0, 2]
    assert len(log.warnings) == 1, log.warnings
    assert f"{shard}: 1 record(s) of party 1 hold NaN or Inf gradients (step 1)" in log.warnings[0]


def test_a_shard_saved_twice_is_refused_naming_both_shards(tmp_path: Path) -> None:
    """A copy of shard 0 saved under a later shard's name: every step of it would be analysed
    twice; the log is inconsistent, and reading it says which two shards hold the step."""
    import shutil

    _store_batches(tmp_path / "g", steps=7)
    shards = sorted((tmp_path / "g" / "party_1").glob("shard-*"))
    copy = shards[0].with_name("shard-000099.arrows")
    shutil.copy(shards[0], copy)
    log = GradientLog(tmp_path / "g")
    with pytest.raises(LogFormatError) as refused:
        list(log.batches(1))
    message = str(refused.value)
    assert f"step 0 of party 1 is logged twice: in {shards[0]} and in {copy}" in message, message


def test_damaged_record_metadata_names_the_shard(tmp_path: Path) -> None:
    _store_batches(tmp_path / "g", steps=3, shard_bytes=1 << 20)
    shard = tmp_path / "g" / "party_1" / "shard-000000.arrows"
    end = _prefix(shard, before_step=1).end  # where step 1's message starts
    data = bytearray(shard.read_bytes())
    data[end:end + 8] = b"\xff" * 8
    shard.write_bytes(bytes(data))
    log = GradientLog(tmp_path / "g")
    assert [b.step for b in log.batches(1)] == [0]
    assert len(log.warnings) == 1
    assert f"{shard}: unreadable after 1 complete record(s)" in log.warnings[0]
    assert "damaged bytes" in log.warnings[0]


@pytest.mark.parametrize("damage", ["garbage", "directory", "missing"])
def test_an_unreadable_index_is_read_around_and_left_alone(tmp_path: Path, damage: str) -> None:
    written = _store_batches(tmp_path / "g", steps=7)
    index = tmp_path / "g" / INDEX
    index.unlink()
    if damage == "garbage":
        index.write_bytes(b"{not json")
    elif damage == "directory":
        index.mkdir()
    log = GradientLog(tmp_path / "g")
    assert log.parties() == [1] and log.run_id == ""
    batches = list(log.batches(1))
    assert [b.step for b in batches] == list(range(7))
    np.testing.assert_array_equal(batches[6].tensors["cut_gradient"], written[6])
    assert len(log.warnings) == 1 and "read from its shards" in log.warnings[0]
    assert str(index) in log.warnings[0]
    assert index.is_dir() if damage == "directory" else (
        index.read_bytes() == b"{not json" if damage == "garbage" else not index.exists())


def test_store_refuses_shape_change_and_never_overwrites(tmp_path: Path) -> None:
    store = GradientStore(tmp_path / "g", "r")
    store.append(1, 0, 0, np.arange(2), {"cut_gradient": np.zeros((2, 3), np.float32)})
    with pytest.raises(RecordError, match="differ"):
        store.append(1, 0, 1, np.arange(2), {"cut_gradient": np.zeros((2, 4), np.float32)})
    store.close()
    with pytest.raises(RecordError, match="already holds a gradient log"):
        GradientStore(tmp_path / "g", "r")


def _start_sidecar(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port_file = tmp_path / "sidecar.address"
    proc = subprocess.Popen([sys.executable, "-m", "attacker", "serve", "--listen", "127.0.0.1:0",
                             "--out", str(tmp_path / "run"), "--port-file", str(port_file), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.monotonic() + 60
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()[0]
        time.sleep(0.05)
    return proc, port_file.read_text().strip()


def _record(party: int, step: int, rows: int = 4) -> apb.GradientRecord:
    return apb.GradientRecord(run_id="r1", party_id=party, epoch=0, step=step,
                              sample_ids=encode_ids(np.arange(rows, dtype=np.int64)),
                              cut_gradient=encode_tensor(np.ones((rows, 3), np.float32)))


async def _send(address: str, records: list[apb.GradientRecord]) -> apb.RecordSummary:
    async with grpc.aio.insecure_channel(address) as channel:
        return await apb_grpc.AttackerSidecarStub(channel).Record(iter(records), timeout=20)


def test_sidecar_refuses_unobserved_party_and_bad_records(tmp_path: Path) -> None:
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--run-id", "r1")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            asyncio.run(_send(address, [_record(2, 0)]))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "passive party 2 are not accepted" in err.value.details()
        bad = _record(1, 0)
        bad.cut_gradient.data = bad.cut_gradient.data[:-4]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            asyncio.run(_send(address, [bad]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "cut_gradient" in err.value.details() and "bytes" in err.value.details()
    finally:
        proc.kill()
        proc.wait()


def test_sidecar_records_and_exits_when_observed_parties_are_done(tmp_path: Path) -> None:
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--run-id", "r1")
    summary = asyncio.run(_send(address, [_record(1, s) for s in range(5)]))
    assert (summary.records, summary.rows) == (5, 20)
    assert proc.wait(timeout=30) == 0
    # A closed stream is not a finished run (the party may have been stopped): at 920e7e0 the
    # sidecar said "recorded every observed party" after a run's Ctrl-C; now it says what it holds.
    out = proc.communicate()[0]
    assert "every observed party closed its stream (passive party 1: 5 record(s) up to step 4)" in out
    assert "recorded every observed party" not in out
    log = GradientLog(tmp_path / "run" / "attacker" / "gradients")
    assert [b.step for b in log.batches(1)] == list(range(5))



def _logged_steps(run: Path) -> list[int]:
    return [b.step for b in GradientLog(RunDir(run).gradients).batches(1)]


async def _break_stream(address: str, steps: range) -> None:
    """Stream `steps` on a Record call and, once the sidecar logged them, break it off, as a
    party that fails does: its process ends with the call still open."""
    async def records() -> AsyncIterator[apb.GradientRecord]:
        for step in steps:
            yield _record(1, step)
        await asyncio.sleep(scaled(60))

    async with grpc.aio.insecure_channel(address) as channel:
        stub = apb_grpc.AttackerSidecarStub(channel)
        call = stub.Record(records())
        await stub.Sync(apb.SyncRequest(run_id="r1", party_id=1, step=steps.stop,
                                        mode=apb.SyncRequest.CHECKPOINT), timeout=scaled(30))
        call.cancel()


async def _rewind(address: str, step: int) -> None:
    """A resumed tap's first call: cut the log back to `step`, once the sidecar lets it."""
    end = time.monotonic() + scaled(30)
    async with grpc.aio.insecure_channel(address) as channel:
        while True:
            try:
                await apb_grpc.AttackerSidecarStub(channel).Sync(apb.SyncRequest(
                    run_id="r1", party_id=1, step=step, mode=apb.SyncRequest.REWIND), timeout=20)
                return
            except grpc.aio.AioRpcError as err:  # its broken stream is not noticed yet
                assert err.code() == grpc.StatusCode.ALREADY_EXISTS and time.monotonic() < end, (
                    err.details())
                await asyncio.sleep(0.05)


def test_a_sidecar_whose_tapped_stream_broke_ends_naming_it(tmp_path: Path) -> None:
    """At 29408f7 a stream broken off (its party failed, its call cancelled) either counted as
    closed (exit 0: "every observed party closed its stream") or as neither closed nor
    streaming: the sidecar then waited out twice the join deadline (240 s) and blamed the party
    for never opening one. Now it ends within seconds, exit 1, naming the broken stream."""
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--run-id", "r1")
    try:
        asyncio.run(_break_stream(address, range(3)))
        out, _ = proc.communicate(timeout=scaled(60))  # far less than the 240 s guard
    finally:
        proc.kill()
        proc.wait()
    last = out.strip().splitlines()[-1]
    assert proc.returncode == 1, out
    assert ("stopped before passive party 1 finished streaming: the Record stream of passive "
            "party 1 broke before it was closed") in last, out
    assert "never opened" not in out and "closed its stream" not in out
    assert _logged_steps(tmp_path / "run") == [0, 1, 2]


def test_a_record_handler_grpc_cancels_counts_its_stream_as_broken(tmp_path: Path) -> None:
    """The other way a broken stream ends: gRPC cancels the handler mid-read (CancelledError).
    At 29408f7 that stream was then neither closed nor streaming, and nothing ended the sidecar
    until its 240 s guard."""
    from attacker.sidecar.servicer import PASSIVE, AttackerServicer

    class Context:
        def auth_context(self) -> dict:
            return {}

    async def cancelled_mid_read() -> AsyncIterator[apb.GradientRecord]:
        for step in range(2):
            yield _record(1, step)
        raise asyncio.CancelledError  # what gRPC injects when the client's call breaks

    async def go() -> AttackerServicer:
        servicer = AttackerServicer(GradientStore(tmp_path / "g", "r1"), {1}, "r1")
        with pytest.raises(asyncio.CancelledError):
            await servicer.Record(cancelled_mid_read(), Context())  # type: ignore[arg-type]
        return servicer

    servicer = asyncio.run(go())
    assert servicer.broken == {(PASSIVE, 1): "broke before it was closed"}
    assert servicer.all_ended.is_set() and not servicer.streaming and not servicer.finished


def test_a_broken_stream_opened_again_at_once_goes_on_being_recorded(tmp_path: Path) -> None:
    """A tap that opens its stream again within the grace (a party resumed at once: rewind,
    then stream) keeps the sidecar: it ends 0 when that stream closes."""
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--run-id", "r1")
    try:
        asyncio.run(_break_stream(address, range(3)))
        asyncio.run(_rewind(address, 2))
        summary = asyncio.run(_send(address, [_record(1, s) for s in range(2, 5)]))
        out, _ = proc.communicate(timeout=scaled(30))
    finally:
        proc.kill()
        proc.wait()
    assert summary.records == 3 and proc.returncode == 0, out
    assert "every observed party closed its stream (passive party 1: 5 record(s) up to step 4)" in out
    assert _logged_steps(tmp_path / "run") == list(range(5))


def test_interrupted_sidecar_says_so_in_its_last_line(tmp_path: Path) -> None:
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--party", "2", "--run-id", "r1")
    asyncio.run(_send(address, [_record(1, s) for s in range(3)]))  # party 2 never streams
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    last = out.strip().splitlines()[-1]
    assert "attacker" in last and "interrupted by a signal before passive party 2 finished" in last, out
    assert "recorded every observed party" not in out
    assert [b.step for b in GradientLog(tmp_path / "run" / "attacker" / "gradients").batches(1)] == [0, 1, 2]

def test_a_sidecar_stopped_mid_stream_exits_130_not_done(tmp_path: Path) -> None:
    """Ctrl-C on the sidecar's host while its party still streams: it said 'interrupted' but
    exited 0 (done) once stopping ended the party's stream, so `attacker serve && attacker
    analyze` went on with a cut log."""
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--run-id", "r1")

    async def stream_then_stop() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = apb_grpc.AttackerSidecarStub(channel)

            async def records() -> AsyncIterator[apb.GradientRecord]:
                for step in range(3):
                    yield _record(1, step)
                # the signal once the sidecar holds the 3 records (not while they are in flight)
                await stub.Sync(apb.SyncRequest(run_id="r1", party_id=1, step=3,
                                                mode=apb.SyncRequest.CHECKPOINT),
                                timeout=scaled(30))
                proc.send_signal(signal.SIGINT)  # the stream is still open
                await asyncio.sleep(scaled(30))

            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Record(records(), timeout=scaled(30))

    try:
        asyncio.run(stream_then_stop())
        out, _ = proc.communicate(timeout=scaled(30))
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, out
    assert "interrupted by a signal" in out, out
    assert [b.step for b in GradientLog(tmp_path / "run" / "attacker" / "gradients").batches(1)] == [0, 1, 2]


@pytest.mark.slow
def test_killed_sidecar_loses_at_most_the_record_in_flight(tmp_path: Path) -> None:
    data = small_config(tmp_path, training={"batch_size": 16, "epochs": 8, "eval_interval": 0},
                        attacker={"on_sidecar_failure": "continue", "record_first_layer": False})
    path = write_config(tmp_path, data)
    proc = subprocess.Popen([sys.executable, "-m", "orchestration", "run", str(path), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    runs = tmp_path / "runs"
    end = time.monotonic() + 120
    while not list(runs.glob("*/pids.json")):
        assert time.monotonic() < end and proc.poll() is None
        time.sleep(0.05)
    run = RunDir(next(runs.glob("*/pids.json")).parent)
    pids = json.loads((run.root / "pids.json").read_text())
    # Kill once the sidecar has written ten records: on a loaded machine it may start writing
    # only after many steps were handed to gRPC (the flow-control window holds them).
    while not ((run.attacker / "gradients" / "index.json").exists()
               and sum(1 for _ in GradientLog(run.attacker / "gradients").batches(1)) >= 10):
        assert time.monotonic() < end and proc.poll() is None
        time.sleep(0.02)
    os.kill(pids["attacker sidecar"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out  # the run goes on unobserved, as configured

    tap = json.loads((run.passive_party(1) / "tap.json").read_text())
    assert tap["gap_records"] > 0 and tap["error"]
    log = GradientLog(run.attacker / "gradients")
    steps = [b.step for b in log.batches(1)]
    assert steps == list(range(len(steps))) and len(steps) >= 10  # a complete prefix
    total = sum(1 for r in read_metrics(run.metrics) if r["type"] == "train")
    assert tap["sent"] + tap["gap_records"] == total  # every record is accounted for
    assert len(steps) <= tap["sent"] and tap["gap_first_step"] >= len(steps)

    # The numbers for what was written equal those of the in-process reference (same seed).
    cfg = parse_config(data)
    ref = create_run_dir(cfg, tmp_path / "ref")
    run_reference(cfg, ref)
    analyze(run.root)
    analyze(ref.root)
    ours = pq.read_table(run.attacker / "leak.parquet").to_pylist()
    theirs = {(r["attack"], r["step"], r["draw"]): r
              for r in pq.read_table(ref.attacker / "leak.parquet").to_pylist()}
    assert ours
    for row in ours:
        other = theirs[(row["attack"], row["step"], row["draw"])]
        assert row["skip_reason"] == other["skip_reason"]
        if row["auc_raw"] is not None:
            assert row["auc_raw"] == pytest.approx(other["auc_raw"], abs=1e-6)


def test_the_config_not_the_first_record_fixes_the_shapes(tmp_path: Path) -> None:
    """At 920e7e0 a first record of any width set party 1's log schema, and the party's real
    records were then refused as a change of shape."""
    from attacker.sidecar.server import record_shapes
    from attacker.sidecar.servicer import PASSIVE
    from tests.live import gradient_record, record_stream, sidecar

    cfg = parse_config(small_config(tmp_path))
    shapes = record_shapes(cfg)
    (width,) = shapes[(PASSIVE, 1)]["cut_gradient"]
    assert shapes[(PASSIVE, 2)]["first_layer_gradient"] == (16,)

    async def go() -> tuple[grpc.aio.AioRpcError, apb.RecordSummary]:
        async with sidecar(tmp_path / "run", shapes=shapes) as (address, _):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await record_stream(address, [gradient_record(1, 0, width=width + 1)])
            return err.value, await record_stream(address, [gradient_record(1, 0, width=width)])

    err, summary = asyncio.run(go())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert f"rows of shape [{width + 1}], but the shared config gives passive party 1's bottom " \
           f"model [{width}]" in err.details()
    assert summary.records == 1


def test_a_sparse_record_never_expands_past_a_message_or_the_configs_shape(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At c2d3f12 a 36-byte sparse record of shape [1, 2**26] (no values) made a sidecar
    without --config write 256 MiB to disk per record, and one with --config expand it (256 MiB)
    before refusing its shape."""
    import splitleak.codec as codec
    from attacker.sidecar.server import record_shapes
    from attacker.sidecar.servicer import PASSIVE
    from splitleak.v1 import tensor_pb2
    from tests.live import gradient_record, record_stream, sidecar

    def bomb(columns: int) -> apb.GradientRecord:
        record = gradient_record(1, 0, rows=1)
        record.cut_gradient.CopyFrom(tensor_pb2.Tensor(dtype=tensor_pb2.FLOAT32, shape=[1, columns],
                                                       sparse=True))
        return record

    expanded: list[list[int]] = []
    original = codec._expanded
    monkeypatch.setattr(codec, "_expanded", lambda msg, field, spec, dims, limit: (
        expanded.append(dims), original(msg, field, spec, dims, limit))[1])
    cfg = parse_config(small_config(tmp_path))
    shapes = record_shapes(cfg)
    (width,) = shapes[(PASSIVE, 1)]["cut_gradient"]

    async def go() -> list[grpc.aio.AioRpcError]:
        errors = []
        for kwargs in ({"limit_mb": 1}, {"shapes": shapes}):
            async with sidecar(tmp_path / f"run{len(errors)}", **kwargs) as (address, _):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await record_stream(address, [bomb(1 << 26)])
                errors.append(err.value)
        return errors

    unbounded, configured = asyncio.run(go())
    assert unbounded.code() == grpc.StatusCode.INVALID_ARGUMENT, unbounded.details()
    assert f"has {1 << 26} elements; at most {(1 << 20) // 4}" in unbounded.details()
    assert configured.code() == grpc.StatusCode.INVALID_ARGUMENT, configured.details()
    assert f"rows of shape [{1 << 26}], but the shared config gives passive party 1's bottom " \
           f"model [{width}]" in configured.details()
    assert expanded == [[1, 1 << 26]]  # the first sidecar checked it, and refused, no array made
    assert not list((tmp_path / "run0").rglob("shard-*")) or all(
        f.stat().st_size < 1 << 20 for f in (tmp_path / "run0").rglob("shard-*"))


def test_refusals_are_logged_at_a_bounded_rate(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """At 920e7e0 each refused stream wrote a line (24,000 refusals: 4.9 MB of log)."""
    from tests.live import gradient_record, record_stream, sidecar

    async def go() -> None:
        async with sidecar(tmp_path / "run") as (address, servicer):
            for _ in range(60):
                with pytest.raises(grpc.aio.AioRpcError):
                    await record_stream(address, [gradient_record(7, 0)])
            servicer.refusals.flush()

    with caplog.at_level("WARNING", logger="attacker"):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if r.name == "attacker"]
    assert len(lines) == 21, lines[-3:]
    assert lines[-1].startswith("40 more refusal(s) within 60 s were not logged one by one; the "
                                "last: refused passive party 7: records from passive party 7")


@pytest.mark.slow
def test_refused_streams_leave_nothing_behind(tmp_path: Path) -> None:
    """At 920e7e0 the sidecar's RSS grew by about 1 KB (3.4 KB measured elsewhere) with every
    refused stream: the exceptions of context.abort outlived their calls."""
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--run-id", "r1")

    def rss_kb() -> int:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        return int(status.split("VmRSS:")[1].split()[0])

    async def refused(count: int) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = apb_grpc.AttackerSidecarStub(channel)
            for i in range(count):
                record = _record(7 if i % 2 else 1, 0)
                record.run_id = "r1" if i % 2 else "other"
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.Record(iter([record]), timeout=20)

    try:
        asyncio.run(refused(1500))  # warm up: pools, caches, the allocator's arenas
        before = rss_kb()
        asyncio.run(refused(4000))
        growth = rss_kb() - before
    finally:
        proc.kill()
        proc.wait()
    assert growth < 1500, f"RSS grew {growth} KB over 4000 refused streams"


def test_a_conv_bottoms_first_layer_gradient_keeps_its_channels(tmp_path: Path) -> None:
    """At 801813a the sidecar expected a CNN party's first-layer gradient flat ([256]) while
    the party records it per channel ([8, 8, 4]), and refused every record of the run."""
    from attacker.sidecar.server import record_shapes
    from attacker.sidecar.servicer import PASSIVE

    cfg = parse_config(small_config(
        tmp_path, dataset={"name": "digits", "test_fraction": 0.2},
        features={"passive": [[0, 4], [4, 8]]},
        model={"kind": "cnn", "channels": [8], "layers": [32], "cut_layer": 1}))
    assert record_shapes(cfg)[(PASSIVE, 2)]["first_layer_gradient"] == (8, 8, 4)
