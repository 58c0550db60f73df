"""Checkpoints and resume within one event loop (every party's real server or client on
loopback): an interrupted run resumed equals an uninterrupted one bit for bit; the files and
refusals around it. The kill -9 / SIGSTOP matrix with real processes is tests/test_faults.py."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import grpc
import pytest

from orchestration.cli import main as splitleak_main
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import write_config
from splitleak.checkpoint import (
    MANIFEST,
    CheckpointError,
    Position,
    complete_manifests,
    latest,
    resume_point,
    step_dir,
)
from splitleak.config import AttackerConfig, ExperimentConfig, TopologyConfig, parse_config
from splitleak.tap import Tap, TapError
from tests.conftest import scaled, small_config
from tests.conftest import write_config as write_toml
from tests.live import whole_run
from tests.runs import assert_same_run, held_by_another
from tests.test_cli_refusals import exit_code_and_text


def resumable(tmp_path: Path, **overrides) -> ExperimentConfig:
    """breast_cancer in batches of 16: 27 train steps, a checkpoint every 5, a stateful
    defense (its state must survive too), the sidecar recording party 1."""
    overrides = {"training": {"batch_size": 16, "epochs": 1, "eval_interval": 7,
                              "checkpoint_every": 5},
                 "defense": [{"name": "discrete_sgd", "bins": 6}],
                 "topology": {"step_deadline_s": scaled(20), "join_deadline_s": scaled(30)},
                 **overrides}
    data = small_config(tmp_path, **overrides)
    return parse_config(data)


def fresh_run(cfg: ExperimentConfig, root: Path) -> RunDir:
    run = RunDir(root)
    root.mkdir(parents=True)
    write_config(cfg, run)
    return run


def test_interrupted_run_resumes_to_the_same_numbers(tmp_path: Path) -> None:
    cfg = resumable(tmp_path)
    straight = fresh_run(cfg, tmp_path / "straight")
    outcome, errors = asyncio.run(whole_run(cfg, straight.root))
    assert outcome["status"] == "ok" and errors == [None, None]

    run = fresh_run(cfg, tmp_path / "interrupted")
    outcome, errors = asyncio.run(whole_run(cfg, run.root, interrupt_at=22))
    assert outcome["status"] == "interrupted" and outcome["step"] == outcome["checkpoint_step"]
    assert outcome["step"] >= 23 and all(errors)  # every party was told and stopped
    assert "interrupted at step" in str(errors[0])
    manifest = latest(run.root)  # stopped at a checkpoint (its own, or a periodic one just taken)
    assert manifest is not None and manifest.step == outcome["step"]
    assert manifest.reason in ("interrupted", "periodic")
    assert (run.label_party / "labels.parquet").exists()
    # Bounded disk: the newest two complete checkpoints.
    assert len(complete_manifests(run.root)) == 2
    assert len(list((run.root / "checkpoints").iterdir())) == 2

    outcome, errors = asyncio.run(whole_run(cfg, run.root, resume=True))
    assert outcome["status"] == "ok" and outcome["resumed_from"] == manifest.step
    assert errors == [None, None]
    assert_same_run(straight, run, parties=2)


def test_manifest_is_written_last_and_names_every_file(tmp_path: Path) -> None:
    cfg = resumable(tmp_path)
    run = fresh_run(cfg, tmp_path / "run")
    asyncio.run(whole_run(cfg, run.root, interrupt_at=12))
    manifest = latest(run.root)
    directory = step_dir(run.root, manifest.position)
    names = sorted(p.name for p in directory.iterdir())
    assert names == sorted([MANIFEST, *manifest.files])
    assert sorted(manifest.files) == ["label_party.pt", "passive_party_1.pt", "passive_party_2.pt"]
    newest = max(p.stat().st_mtime_ns for p in directory.iterdir() if p.name != MANIFEST)
    assert (directory / MANIFEST).stat().st_mtime_ns >= newest
    assert manifest.recorded == {"1": manifest.step}  # the sidecar holds every record so far
    records = (run.label_party / "metrics.jsonl").read_text().splitlines()
    assert len(records) >= manifest.metrics_records


def test_resume_with_a_changed_config_is_refused_naming_it(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    cfg = resumable(tmp_path)
    run = fresh_run(cfg, tmp_path / "run")
    changed = write_toml(tmp_path, small_config(tmp_path, training={
        "batch_size": 32, "epochs": 1, "eval_interval": 7, "checkpoint_every": 5},
        defense=[{"name": "discrete_sgd", "bins": 6}],
        topology={"step_deadline_s": scaled(20), "join_deadline_s": scaled(30)}), "changed.toml")
    code, text = exit_code_and_text(splitleak_main, ["run", str(changed), "--resume", str(run.root),
                                                     "--no-progress"], capsys)
    assert code == 2 and "Traceback" not in text, text
    assert "training.batch_size: 16 -> 32" in text
    (run.label_party).mkdir(exist_ok=True)
    run.outcome.write_text(json.dumps({"status": "ok"}))
    code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root)], capsys)
    assert code == 2 and "nothing to resume" in text


def test_labels_are_written_when_training_starts(tmp_path: Path) -> None:
    """Before any party has joined, the analysis already has its ground truth."""
    from tests.live import label_party

    cfg = resumable(tmp_path)

    async def go() -> bool:
        async with label_party(cfg, tmp_path / "run"):
            return (tmp_path / "run" / "label_party" / "labels.parquet").exists()

    assert asyncio.run(go())


def test_a_party_started_without_resume_says_so_at_once(tmp_path: Path) -> None:
    """One party per host: a passive party that was not started with --resume cannot load
    its checkpoint; the label party hears why at once (not at its join deadline)."""
    cfg = resumable(tmp_path, topology={"step_deadline_s": scaled(20), "join_deadline_s": 600})
    run = fresh_run(cfg, tmp_path / "run")
    asyncio.run(whole_run(cfg, run.root, interrupt_at=6))
    outcome, errors = asyncio.run(asyncio.wait_for(
        whole_run(cfg, run.root, resume=True, parties_resume=False), scaled(60)))
    assert outcome["status"] == "failed" and outcome["culprit"] in ("passive party 1",
                                                                    "passive party 2")
    assert outcome["message"].startswith(f"{outcome['culprit']} stopped: the label party resumes")
    assert "start this party with --resume RUN_DIR" in outcome["message"]
    assert all("start this party with --resume" in str(e) for e in errors)


@pytest.mark.parametrize("mode", ["fail", "continue"])
def test_no_checkpoint_claims_a_log_whose_sidecar_is_gone(mode: str) -> None:
    """A sidecar that failed before a checkpoint may have lost records in flight: with "fail",
    the party must not acknowledge the checkpoint (a resume from it would miss those records)."""
    async def sync_after_failure() -> int:
        tap = Tap("127.0.0.1:9", AttackerConfig(on_sidecar_failure=mode), TopologyConfig(tls=False))
        tap.error = "attacker sidecar at 127.0.0.1:9: UNAVAILABLE: Connection reset by peer"
        try:
            return await tap.sync(15)
        finally:
            await tap.channel.close()

    if mode == "fail":
        with pytest.raises(TapError, match="no checkpoint at step 15"):
            asyncio.run(sync_after_failure())
    else:
        assert asyncio.run(sync_after_failure()) == 0  # the run goes on unobserved, as configured


def test_a_checkpoint_after_a_failure_that_cannot_be_written_leaves_the_failure_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With its disk full at a periodic checkpoint, the label party tried the checkpoint after
    the failure again; its ENOSPC escaped, and the run said only 'label party exited with code
    1: label party failed' (a traceback in its log). No checkpoint is written then; the
    failure it is after (the full disk, named) is what the run reports."""
    import errno
    from types import SimpleNamespace

    from label_party.checkpoints import RunCheckpoints
    from label_party.driver import Progress
    from label_party.session import SessionError

    async def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "label_party.pt"))

    checkpoints = RunCheckpoints.__new__(RunCheckpoints)
    checkpoints.every, checkpoints.last = 20, Position(160, 190)
    checkpoints.progress = Progress()
    checkpoints.progress.boundary = Position(180, 225)
    checkpoints.cfg = SimpleNamespace(topology=TopologyConfig())  # type: ignore[assignment]
    monkeypatch.setattr(checkpoints, "take", full)
    error = SessionError(grpc.StatusCode.RESOURCE_EXHAUSTED, "the label party cannot write")
    assert asyncio.run(checkpoints.after_failure(error, connected=True)) is None


@pytest.fixture(scope="module")
def straight_and_interrupted(tmp_path_factory: pytest.TempPathFactory
                             ) -> tuple[ExperimentConfig, RunDir, RunDir]:
    """One config; a run of it straight through, and one interrupted at step 22 (two complete
    checkpoints on disk), for the tests below to copy and damage."""
    base = tmp_path_factory.mktemp("torn")
    cfg = resumable(base)
    straight = fresh_run(cfg, base / "straight")
    assert asyncio.run(whole_run(cfg, straight.root))[0]["status"] == "ok"
    interrupted = fresh_run(cfg, base / "interrupted")
    assert asyncio.run(whole_run(cfg, interrupted.root, interrupt_at=22))[0]["status"] == "interrupted"
    assert len(complete_manifests(interrupted.root)) == 2
    return cfg, straight, interrupted


def _torn_copy(tmp_path: Path, run: RunDir, names: list[str], newest: int = 1) -> RunDir:
    """A copy of `run` whose `newest` newest checkpoints have each of `names` cut in half."""
    copy = RunDir(tmp_path / run.root.name)
    shutil.copytree(run.root, copy.root)
    for manifest in complete_manifests(copy.root)[-newest:]:
        for name in names:
            path = step_dir(copy.root, manifest.position) / name
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return copy


@pytest.mark.parametrize("torn", ["passive_party_1.pt", "label_party.pt"])
def test_a_torn_newest_checkpoint_falls_back_to_the_older_one(
        tmp_path: Path, straight_and_interrupted, torn: str) -> None:
    cfg, straight, interrupted = straight_and_interrupted
    run = _torn_copy(tmp_path, interrupted, [torn])
    older, newest = complete_manifests(run.root)
    assert resume_point(run.root, cfg) == older
    outcome, errors = asyncio.run(whole_run(cfg, run.root, resume=True))
    assert outcome["status"] == "ok" and outcome["resumed_from"] == older.step, outcome
    assert errors == [None, None]
    assert_same_run(straight, run, parties=2)


def test_no_whole_checkpoint_is_a_read_problem_not_a_write_problem(
        tmp_path: Path, straight_and_interrupted, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, _, interrupted = straight_and_interrupted
    run = _torn_copy(tmp_path, interrupted, ["label_party.pt"], newest=2)
    code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                     "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 2 and "Traceback" not in text, text
    assert "is unusable" in text and "does not match the manifest's SHA-256" in text, text
    # A label party told to resume from a torn checkpoint anyway (e.g. by hand) says so.
    monkeypatch.setattr("splitleak.checkpoint.resume_point", lambda root, cfg: latest(root))
    outcome, _ = asyncio.run(whole_run(cfg, run.root, resume=True))
    assert outcome["status"] == "failed" and outcome["code"] == "FAILED_PRECONDITION", outcome
    assert outcome["message"].startswith("the label party cannot resume: checkpoint file"), outcome
    assert "cannot write" not in outcome["message"]


def test_a_run_in_use_is_not_resumed_a_second_time(tmp_path: Path, straight_and_interrupted,
                                                   capsys: pytest.CaptureFixture) -> None:
    """Two resumes of one run would each start a label party, and the parties of one could
    join the other's; the second is refused while the first holds the run."""
    _, _, interrupted = straight_and_interrupted
    run = _torn_copy(tmp_path, interrupted, [])
    with held_by_another(run.root / "run.lock"):
        code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                         "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 2 and "is in use by another splitleak process (pid 4242)" in text, text
    assert f"resuming {run.root}" not in text, text  # said only once the run is held
    assert not (run.root / "pids.json").exists()  # no party was started


def test_a_fallback_to_an_older_checkpoint_is_said_once(
        tmp_path: Path, straight_and_interrupted, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest checkpoint torn: why it is passed over was logged twice (the resume point was
    found before the run's lock and again under it); now once, then the step it resumes at."""
    from orchestration.run import RunFailed

    cfg, _, interrupted = straight_and_interrupted
    run = _torn_copy(tmp_path, interrupted, ["passive_party_1.pt"])
    older, _ = complete_manifests(run.root)

    def no_roles(*args, **kwargs):  # stop the run where its roles would start
        raise RunFailed("stopped by the test")

    monkeypatch.setattr("orchestration.run.launch_plan", no_roles)
    code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                     "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 1 and "stopped by the test" in text, text
    assert text.count("is unusable") == 1, text
    assert f"resuming from the checkpoint of step {older.step}" in text, text
    assert f"resuming {run.root} at step {older.step} (" in text, text


def test_a_run_made_with_output_dir_resumes_with_its_own_experiment_file(
        tmp_path: Path, straight_and_interrupted) -> None:
    """`splitleak run exp.toml --output-dir D`, then `splitleak run exp.toml --resume D/<run>`:
    exp.toml's output_dir names another place, which is not a change of the experiment."""
    cfg, _, interrupted = straight_and_interrupted
    elsewhere = cfg.model_copy(update={"run": cfg.run.model_copy(update={"output_dir": tmp_path})})
    assert resume_point(interrupted.root, elsewhere) == complete_manifests(interrupted.root)[-1]
    changed = cfg.model_copy(update={"run": cfg.run.model_copy(update={"seed": 99})})
    with pytest.raises(CheckpointError, match="run.seed: 3 -> 99"):
        resume_point(interrupted.root, changed)


@pytest.mark.parametrize("before", ["interrupted", "failed"])
def test_a_resume_the_label_party_refuses_is_reported_with_its_reason(
        tmp_path: Path, straight_and_interrupted, capsys: pytest.CaptureFixture, before: str) -> None:
    """The roles' logs are appended to: the interrupted attempt's last ERROR line ("resume it
    with --resume") is not this attempt's reason, in the message or in outcome.json, nor is
    the outcome of an attempt that failed."""
    _, _, interrupted = straight_and_interrupted
    run = _torn_copy(tmp_path, interrupted, [])
    if before == "failed":
        outcome = json.loads(run.outcome.read_text())
        run.outcome.write_text(json.dumps({**outcome, "status": "failed", "code": "UNAVAILABLE",
                                           "message": "training finished: interrupted"}))
    run.logs.mkdir(exist_ok=True)
    (run.logs / "label_party.log").write_text(
        "2026-11-27 07:00:06,000 label-party ERROR training finished: interrupted (the run was "
        f"interrupted at step 20; resume it with --resume {run.root})\n")
    run.metrics.write_text("")  # the label party refuses: fewer records than the checkpoint counts
    code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                     "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 2 and re.search(r"holds 0 records but the checkpoint of step \d+ counts", text), text
    assert "training finished: interrupted" not in text, text
    assert "once what is named above is fixed, finish the run with" in text, text
    outcome = json.loads(run.outcome.read_text())
    assert outcome["status"] == "failed" and "holds 0 records" in outcome["message"], outcome


def _short_log(tmp_path: Path, run: RunDir, before_step: int) -> RunDir:
    """A copy of `run` whose party 1 gradient log is cut after its records of steps before
    `before_step` (as a shard truncated by hand)."""
    from splitleak.artifacts.gradient_shards import shard_prefix, shards

    copy = _torn_copy(tmp_path, run, [])
    cut = False
    for shard in shards(copy.gradients / "party_1"):
        if cut:
            shard.unlink()
            continue
        prefix = shard_prefix(shard, before_step=before_step)
        if not prefix.whole:
            shard.write_bytes(shard.read_bytes()[:prefix.end])
            cut = True
    return copy


def test_a_log_short_of_the_newest_checkpoint_resumes_from_the_older_one(
        tmp_path: Path, straight_and_interrupted, caplog: pytest.LogCaptureFixture) -> None:
    cfg, straight, interrupted = straight_and_interrupted
    older, newest = complete_manifests(interrupted.root)
    assert older.recorded["1"] < newest.recorded["1"]
    run = _short_log(tmp_path, interrupted, before_step=older.step + 1)
    with caplog.at_level("WARNING", logger="splitleak"):
        assert resume_point(run.root, cfg) == older
    assert (f"the checkpoint of step {newest.step} is unusable: party 1's gradient log holds "
            f"{older.step + 1} record(s)") in caplog.text, caplog.text
    outcome, errors = asyncio.run(whole_run(cfg, run.root, resume=True))
    assert outcome["status"] == "ok" and outcome["resumed_from"] == older.step, outcome
    assert errors == [None, None]
    assert_same_run(straight, run, parties=2)


def test_a_log_short_of_every_checkpoint_is_refused_naming_shard_and_counts(
        tmp_path: Path, straight_and_interrupted, capsys: pytest.CaptureFixture) -> None:
    _, _, interrupted = straight_and_interrupted
    older, newest = complete_manifests(interrupted.root)
    run = _short_log(tmp_path, interrupted, before_step=older.step - 1)
    code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                     "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 2 and "Traceback" not in text, text
    for manifest in (older, newest):
        assert (f"the checkpoint of step {manifest.step} is unusable: party 1's gradient log holds "
                f"{older.step - 1} record(s) of the steps before {manifest.step} (the count ends in "
                f"{run.gradients / 'party_1'}/shard-") in text, text
        assert f"but the checkpoint counts {manifest.recorded['1']}" in text, text
    assert not (run.root / "pids.json").exists()  # no party was started


def test_a_gradient_log_gone_altogether_is_refused(
        tmp_path: Path, straight_and_interrupted, capsys: pytest.CaptureFixture) -> None:
    """`splitleak run`'s sidecar logs into the run directory: a checkpoint counting records of
    a log that is gone cannot be resumed without losing those steps for good."""
    _, _, interrupted = straight_and_interrupted
    run = _torn_copy(tmp_path, interrupted, [])
    shutil.rmtree(run.gradients)
    newest = complete_manifests(run.root)[-1]
    code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                     "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 2 and "Traceback" not in text, text
    assert (f"the checkpoint of step {newest.step} counts gradient records "
            f"({newest.recorded['1']} of party 1), but the run's gradient log {run.gradients} "
            "is gone") in text, text
    assert not (run.root / "pids.json").exists()  # no party was started


def test_a_read_only_run_directory_is_refused_in_one_sentence(
        tmp_path: Path, straight_and_interrupted, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`splitleak run --resume` of a run on a read-only file system ended in a traceback (the
    run's lock could not be created, exit 1); it is now bad input naming the file and why."""
    import errno
    import os

    _, _, interrupted = straight_and_interrupted
    run = _torn_copy(tmp_path, interrupted, [])

    def read_only(_: RunDir) -> None:  # as os.open of run.lock on a read-only mount
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(run.lock))

    monkeypatch.setattr("orchestration.run.exclusive", read_only)
    code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                     "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 2 and "Traceback" not in text, text
    assert f"cannot write {run.lock}: Read-only file system" in text, text
    assert not (run.root / "pids.json").exists()  # no party was started


def test_a_party_file_gone_from_the_newest_checkpoint_resumes_from_the_older_one(
        tmp_path: Path, straight_and_interrupted, capsys: pytest.CaptureFixture,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """`splitleak run` keeps every party's checkpoints in the run directory. A party file gone
    from the newest one failed the resume (exit 1: the party could not load it), and the hint
    printed, `--resume` again, failed the same way every time; the resume now passes over that
    checkpoint as over a torn one (a warning naming the file) and equals a straight run."""
    cfg, straight, interrupted = straight_and_interrupted
    run = _torn_copy(tmp_path, interrupted, [])
    older, newest = complete_manifests(run.root)
    gone = step_dir(run.root, newest.position) / "passive_party_1.pt"
    gone.unlink()
    assert resume_point(run.root, cfg) == newest  # the label party alone cannot tell (hosts)

    def started(*args: object, **kwargs: object) -> None:
        raise SystemExit(0)  # where the parties would start

    monkeypatch.setattr("orchestration.run.launch_plan", started)
    with caplog.at_level("WARNING", logger="splitleak"):
        code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                         "--no-progress"], capsys)
    text = " ".join((text + caplog.text).split())
    assert code == 0, text
    assert f"the checkpoint of step {newest.step} is unusable: {gone} is missing" in text, text
    assert f"at step {older.step}" in text, text
    assert complete_manifests(run.root) == [older]  # the label party resumes from it too
    outcome, errors = asyncio.run(whole_run(cfg, run.root, resume=True))
    assert outcome["status"] == "ok" and outcome["resumed_from"] == older.step, outcome
    assert errors == [None, None]
    assert_same_run(straight, run, parties=2)


def test_a_sweep_point_whose_party_file_is_gone_resumes_every_role_from_the_older_one(
        tmp_path: Path, straight_and_interrupted) -> None:
    """A sweep point's driver (the Ray engine with --shared-dir resumes the point itself)
    passed over a checkpoint a party's file is gone from, but left it on disk: the label party,
    which cannot tell, resumed from it, the party failed to load its file on every retry and
    the driver had cut the metrics back to the older one. The driver now removes it."""
    from orchestration.sweep.engine import resume_run_dir
    from orchestration.sweep.points import Point

    cfg, _, interrupted = straight_and_interrupted
    run = _torn_copy(tmp_path, interrupted, [])
    older, newest = complete_manifests(run.root)
    (step_dir(run.root, newest.position) / "passive_party_1.pt").unlink()
    _, flags, why = resume_run_dir(Point(0, "v", (), (), cfg, run.root))
    assert flags == ("--resume",) and f"at step {older.step}" in (why or ""), why
    assert complete_manifests(run.root) == [older]
    assert resume_point(run.root, cfg) == older  # what the label party's role resumes from


def test_a_resume_refused_by_the_lock_removes_no_checkpoint(
        tmp_path: Path, straight_and_interrupted, capsys: pytest.CaptureFixture) -> None:
    """The resume that holds the run may be writing a checkpoint (no manifest yet): a second
    resume, refused, must leave it (and every other file) as it is."""
    _, _, interrupted = straight_and_interrupted
    run = _torn_copy(tmp_path, interrupted, [])
    newest = complete_manifests(run.root)[-1]
    (step_dir(run.root, newest.position) / "passive_party_1.pt").unlink()  # passed over
    writing = run.root / "checkpoints" / "step-00000099-batch-00000999"  # the holder's
    writing.mkdir()
    with held_by_another(run.root / "run.lock"):
        code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                         "--no-progress"], capsys)
    assert code == 2 and "(pid 4242)" in " ".join(text.split()), text
    assert writing.is_dir() and step_dir(run.root, newest.position).is_dir()


def test_an_outcome_the_orchestrator_writes_names_the_checkpoint_to_resume_from(
        tmp_path: Path, straight_and_interrupted) -> None:
    """The label party killed (its outcome never written): `splitleak run` printed 'checkpoint at
    step N: finish the run with splitleak run --resume' but the outcome.json it wrote named no
    checkpoint, where the label party's own names its newest."""
    from types import SimpleNamespace

    from orchestration.run import RunFailed, _record_failure
    from splitleak.artifacts.outcome import read_outcome

    _, _, interrupted = straight_and_interrupted
    run = RunDir(tmp_path / "killed")
    shutil.copytree(interrupted.root, run.root)
    run.outcome.unlink()  # killed before it wrote one
    newest = complete_manifests(run.root)[-1]
    label = SimpleNamespace(name="label party", returncode=-9)
    _record_failure(run, RunFailed("label party was killed by SIGKILL", label))  # type: ignore[arg-type]
    outcome = read_outcome(run)
    assert outcome["status"] == "failed" and outcome["recorded_by"] == "orchestrator"
    assert outcome["checkpoint"] == step_dir(run.root, newest.position).name
    assert outcome["checkpoint_step"] == newest.step, outcome
