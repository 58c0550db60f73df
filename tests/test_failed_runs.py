"""A run that fails or is interrupted stays analysable (issue 13, item 2): its outcome says
what happened and where, the analysis reports what was recorded and says it is partial, and
a gradient log cut short (a kill, a full disk) is readable with plain pyarrow."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest

from attacker.analysis.analyze import analyze, write_summary
from attacker.report.report import write_report
from attacker.sidecar.store import GradientLog, GradientStore, RecordError
from splitleak.artifacts.gradient_shards import SHARD_SUFFIX
from splitleak.artifacts.paths import RunDir
from splitleak.codec import encode_tensor
from splitleak.config import parse_config
from tests.conftest import scaled, small_config
from tests.live import ScriptedParty, gradient_record, record_stream, scripted_run, sidecar, whole_run
from tests.test_checkpoints import fresh_run, resumable


def test_interrupted_run_is_analysed_as_partial(tmp_path: Path) -> None:
    cfg = resumable(tmp_path)
    run = fresh_run(cfg, tmp_path / "run")
    outcome, _ = asyncio.run(whole_run(cfg, run.root, interrupt_at=8))
    assert json.loads(run.outcome.read_text())["status"] == "interrupted"
    summary = analyze(run.root)
    partial = summary["partial"]
    assert partial["status"] == "interrupted" and partial["step"] == outcome["step"]
    assert partial["train_steps_done"] == outcome["step"] and partial["train_steps_planned"] == 27
    assert summary["warnings"][0].startswith("partial run (interrupted at step")
    log = GradientLog(run.attacker / "gradients")
    assert [b.step for b in log.batches(1)] == list(range(outcome["step"]))
    write_report(run, summary)
    write_summary(run, summary)
    assert "**Partial run** (interrupted)" in (run.report / "report.md").read_text()


def test_failed_outcome_records_code_party_and_step(tmp_path: Path) -> None:
    cfg = parse_config(small_config(
        tmp_path, features={"passive": [[0, 30]]},
        topology={"passive_parties": 1, "step_deadline_s": scaled(2), "join_deadline_s": scaled(10)},
        training={"batch_size": 32, "epochs": 1, "eval_interval": 0}))

    async def three_then_nan(party: ScriptedParty) -> None:
        for _ in range(3):
            message = await party.call.read()
            await party.call.write(party.activation(message.next_batch))
        message = await party.call.read()
        bad = party.activation(message.next_batch)
        bad.activation.CopyFrom(encode_tensor(np.full((2, 2), np.nan, np.float32)))
        await party.call.write(bad)

    _, outcome = asyncio.run(scripted_run(cfg, tmp_path / "run", three_then_nan))
    assert outcome["status"] == "failed" and outcome["code"] == "INVALID_ARGUMENT"
    assert outcome["party"] == 1 and outcome["step"] == 3
    on_disk = json.loads(RunDir(tmp_path / "run").outcome.read_text())
    assert on_disk["step"] == 3 and on_disk["culprit"] == "passive party 1"


def _written(root: Path, steps: int, shard_bytes: int = 700) -> GradientStore:
    store = GradientStore(root, "r", shard_bytes=shard_bytes)
    rng = np.random.default_rng(0)
    for step in range(steps):
        store.append(1, 0, step, np.arange(4), {"cut_gradient": rng.normal(size=(4, 3)).astype(
            np.float32)})
    return store


def test_a_torn_shard_is_read_as_it_is_and_cut_back_only_by_a_resumed_sidecar(tmp_path: Path) -> None:
    store = _written(tmp_path, 5, shard_bytes=1 << 20)  # one shard
    store.close()
    shard = sorted((tmp_path / "party_1").glob("shard-*"))[-1]
    before = len(pa.ipc.open_stream(shard).read_all())
    torn = shard.read_bytes()[:-30]  # killed mid-write
    shard.write_bytes(torn)
    with pytest.raises((OSError, pa.ArrowInvalid)):
        pa.ipc.open_stream(shard).read_all()
    steps = [b.step for b in GradientLog(tmp_path).batches(1)]
    assert steps == [0, 1, 2, 3] and shard.read_bytes() == torn  # a reader changes nothing
    GradientStore(tmp_path, "r", resume=True).close()  # the writer, resuming, cuts it back
    assert len(pa.ipc.open_stream(shard).read_all()) == before - 4


def test_resumed_log_rewinds_and_continues_in_order(tmp_path: Path) -> None:
    _written(tmp_path, 9).close()
    store = GradientStore(tmp_path, "r", shard_bytes=700, resume=True)
    with pytest.raises(RecordError, match="after one of step 8"):
        store.append(1, 0, 5, np.arange(4), {"cut_gradient": np.zeros((4, 3), np.float32)})
    store.rewind(1, 5)
    assert store.counts(1) == (5, 20)
    for step in range(5, 7):
        store.append(1, 0, step, np.arange(4), {"cut_gradient": np.zeros((4, 3), np.float32)})
    store.close()
    assert [b.step for b in GradientLog(tmp_path).batches(1)] == list(range(7))


@pytest.fixture
def small_disk(tmp_path: Path):
    directory = tmp_path / "disk"
    directory.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(directory)],
                             capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("needs a small disk: a tmpfs that root may mount")
    yield directory
    subprocess.run(["umount", "-l", str(directory)], check=False)


def test_a_full_disk_is_resource_exhausted_and_the_log_stays_readable(small_disk: Path) -> None:
    async def go() -> tuple[grpc.aio.AioRpcError, int]:
        async with sidecar(small_disk) as (address, _):
            records = [gradient_record(step=s, rows=64, width=16) for s in range(200)]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await record_stream(address, records)
            return err.value, 0

    err, _ = asyncio.run(go())
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    assert "cannot grow" in err.details() and "No space left on device" in err.details()
    root = RunDir(small_disk).attacker / "gradients"
    shards = sorted((root / "party_1").glob("shard-*"))
    assert shards and not list(root.rglob(".*.tmp"))
    steps = []
    for shard in shards:  # plain pyarrow, no splitleak code
        steps += pa.ipc.open_stream(shard).read_all().column("step").unique().to_pylist()
    assert steps == list(range(len(steps))) and 0 < len(steps) < 200
    assert os.path.getsize(shards[-1]) > 0


def test_a_full_disk_names_the_shard_the_log_could_not_write(small_disk: Path) -> None:
    """'the gradient log at <folder> cannot grow: No space left on device' named the folder,
    never the shard file that failed."""
    store = GradientStore(small_disk / "gradients", "r", shard_bytes=32 << 10)
    with pytest.raises(RecordError) as err:
        for step in range(200):
            store.append(1, 0, step, np.arange(64), {"cut_gradient": np.ones((64, 16), np.float32)})
    store.close()
    shards = re.escape(str(small_disk / "gradients" / "party_1" / "shard-"))
    shard = shards + r"\d{6}" + re.escape(SHARD_SUFFIX)
    assert re.search(f"cannot grow: cannot write {shard}: No space left on device \\(the disk or "
                     r"the file-size limit is full\); it is intact \(up to step \d+\)",
                     str(err.value)), err.value


def test_a_role_failing_after_the_label_party_finished_fails_the_run_and_leaves_it_resumable(
        tmp_path: Path) -> None:
    # The label party wrote "ok", then a sidecar stalled and the party tapping it failed: the
    # run's gradient log is short of its last steps, so the run failed and --resume completes it.
    from types import SimpleNamespace

    from orchestration.run import RunFailed, _record_failure
    from splitleak.artifacts.outcome import read_outcome, write_outcome
    from splitleak.artifacts.rundir import create_run_dir
    from splitleak.checkpoint import CheckpointError, resume_point
    from splitleak.validation import resolved

    cfg = resolved(parse_config(small_config(tmp_path)))
    run = create_run_dir(cfg)
    write_outcome(run, {"status": "ok", "train_steps": 12, "seconds": 1.0})
    with pytest.raises(CheckpointError, match="there is nothing to resume"):
        resume_point(run.root, cfg)
    party = SimpleNamespace(name="passive party 1", returncode=1)
    _record_failure(run, RunFailed("passive party 1 exited with code 1: attacker sidecar at "
                                   "127.0.0.1:1: DEADLINE_EXCEEDED", party))  # type: ignore[arg-type]
    outcome = read_outcome(run)
    assert outcome["status"] == "failed" and outcome["culprit"] == "passive party 1"
    assert outcome["party"] == 1 and outcome["train_steps"] == 12
    assert "a role failed after" in outcome["trained"]
    assert resume_point(run.root, cfg) is None  # no checkpoint in this directory: from step 0
    _record_failure(run, RunFailed("the sidecar again", None))  # the first failure stays
    assert read_outcome(run)["message"].startswith("passive party 1 exited")
