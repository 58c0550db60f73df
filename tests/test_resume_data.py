"""A resume trains on the data its run was trained on, or is refused naming the file: a relative
data path read from another working directory, or a data file changed in place since."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

from orchestration.cli import main as splitleak_main
from splitleak.artifacts.paths import RunDir
from splitleak.checkpoint import CheckpointError, complete_manifests, resume_point
from splitleak.config import ExperimentConfig, parse_config
from tests.conftest import small_config
from tests.live import whole_run
from tests.test_checkpoints import fresh_run
from tests.test_cli_refusals import exit_code_and_text


def spam_file(path: Path, seed: int, rows: int = 160) -> Path:
    """A spambase-format file: 57 features and a label a row."""
    rng = np.random.default_rng(seed)
    x = rng.random((rows, 57))
    y = (x[:, 0] > 0.5).astype(int)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, np.column_stack([x, y]), fmt=["%.4f"] * 57 + ["%d"], delimiter=",")
    return path


def spam_config(tmp_path: Path, path: str) -> ExperimentConfig:
    return parse_config(small_config(
        tmp_path, dataset={"name": "spambase", "params": {"path": path}, "test_fraction": 0.25},
        features={"passive": [[0, 28], [28, 57]]},
        training={"batch_size": 16, "epochs": 1, "eval_interval": 0, "checkpoint_every": 3}))


def interrupted_run(cfg: ExperimentConfig, root: Path) -> RunDir:
    run = fresh_run(cfg, root)
    outcome, _ = asyncio.run(whole_run(cfg, run.root, interrupt_at=5))
    assert outcome["status"] == "interrupted", outcome
    return run


@pytest.fixture(scope="module")
def started_in_a(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExperimentConfig, RunDir, Path]:
    """A run of `spam.data` (relative) started in folder A and interrupted; folder B holds
    another `spam.data`."""
    base = tmp_path_factory.mktemp("data")
    spam_file(base / "A" / "spam.data", seed=0)
    spam_file(base / "B" / "spam.data", seed=1)
    cfg = spam_config(base, "spam.data")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(base / "A")
        run = interrupted_run(cfg, base / "run")
    return cfg, run, base


def test_the_checkpoint_records_the_data_file(started_in_a, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, run, base = started_in_a
    manifest = complete_manifests(run.root)[-1]
    data = manifest.data["dataset.params.path"]
    stat = (base / "A" / "spam.data").stat()
    assert (data.path, data.size, data.mtime_ns) == (str(base / "A" / "spam.data"), stat.st_size,
                                                     stat.st_mtime_ns)
    monkeypatch.chdir(base / "A")
    assert resume_point(run.root, cfg) == manifest


def test_a_resume_from_another_directory_is_refused_naming_the_file(
        started_in_a, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    _, run, base = started_in_a
    monkeypatch.chdir(base / "B")
    code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                     "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 2 and "Traceback" not in text, text
    assert (f"dataset.params.path now names {base / 'B' / 'spam.data'}, not "
            f"{base / 'A' / 'spam.data'}") in text, text
    assert "resume from the directory the run was started in" in text, text
    assert not (run.root / "pids.json").exists()  # no party was started


def test_a_data_file_changed_in_place_is_refused(started_in_a,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, run, base = started_in_a
    monkeypatch.chdir(base / "A")
    data = base / "A" / "spam.data"
    before, stat = data.read_bytes(), data.stat()
    try:
        data.write_bytes(before.replace(b"0", b"1", 1))  # the same size, written again
        os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        with pytest.raises(CheckpointError, match=f"{data} was modified at .*, after the run read it"):
            resume_point(run.root, cfg)
        row = before.split(b"\n", 1)[0] + b"\n"
        data.write_bytes(before + row)  # a row more
        with pytest.raises(CheckpointError, match=f"{data} holds {len(before) + len(row)} bytes, "
                                                  f"not {len(before)}"):
            resume_point(run.root, cfg)
    finally:
        data.write_bytes(before)
        os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert resume_point(run.root, cfg) == complete_manifests(run.root)[-1]


def test_an_absolute_data_path_resumes_from_any_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = spam_file(tmp_path / "A" / "spam.data", seed=0)
    spam_file(tmp_path / "B" / "spam.data", seed=1)
    cfg = spam_config(tmp_path, str(data))
    monkeypatch.chdir(tmp_path / "A")
    run = interrupted_run(cfg, tmp_path / "run")
    monkeypatch.chdir(tmp_path / "B")
    manifest = resume_point(run.root, cfg)
    assert manifest is not None and manifest.data["dataset.params.path"].path == str(data)
    outcome, errors = asyncio.run(whole_run(cfg, run.root, resume=True))
    assert outcome["status"] == "ok" and errors == [None, None], (outcome, errors)


def test_a_data_folder_is_recorded_file_by_file(tmp_path: Path) -> None:
    """CIFAR's path may name the folder its archive unpacks to: each file in it is recorded."""
    from splitleak.data_files import data_changes, data_files

    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for name in ("data_batch_1.bin", "test_batch.bin"):
        (folder / name).write_bytes(b"\0" * 3073)
    cfg = parse_config(small_config(tmp_path, dataset={"name": "cifar10",
                                                       "params": {"path": str(folder)}}))
    files = data_files(cfg)
    assert sorted(files) == ["dataset.params.path/data_batch_1.bin",
                             "dataset.params.path/test_batch.bin"], files
    assert data_changes(files, cfg) == []
    (folder / "test_batch.bin").write_bytes(b"\0" * 3073 * 2)
    assert data_changes(files, cfg) == [f"{folder / 'test_batch.bin'} holds 6146 bytes, not 3073"]


def test_a_checkpoint_from_before_data_files_were_recorded_is_not_checked(
        started_in_a, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import shutil

    from splitleak.checkpoint import MANIFEST, step_dir

    cfg, run, base = started_in_a
    copy = RunDir(tmp_path / "old")
    shutil.copytree(run.root, copy.root)
    for manifest in complete_manifests(copy.root):
        path = step_dir(copy.root, manifest.position) / MANIFEST
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items()
                                    if k != "data"}))
    monkeypatch.chdir(base / "B")
    assert resume_point(copy.root, cfg) == complete_manifests(copy.root)[-1]


def test_a_passive_partys_own_data_file_changed_since_its_checkpoint_is_refused(
        tmp_path: Path) -> None:
    """On its own host a passive party reads its own copy of the data, which the label party's
    check of its files never sees: the party's checkpoint records it, and a resume checks it."""
    from passive_party.client import PartyDataChanged, StepLoop, _restore, load_bottom
    from splitleak.data_files import data_files
    from splitleak.v1 import split_learning_pb2 as pb

    data = spam_file(tmp_path / "party-host" / "spam.data", seed=0)
    cfg = spam_config(tmp_path, str(data))
    run = RunDir(tmp_path / "run")
    bottom = load_bottom(cfg, 2)
    loop = StepLoop(bottom, None, "r", run, cfg.wire, data=data_files(cfg))
    ack = asyncio.run(loop._checkpoint(pb.CheckpointRequest(step=3, batches=3))).checkpoint
    plan = pb.TrainingPlan(run_id="r", resumed=True, resume_step=3, resume_batches=3,
                           resume_sha256=ack.sha256)
    _restore(load_bottom(cfg, 2), run, plan, True, cfg)  # the same file: it resumes
    before, stat = data.read_bytes(), data.stat()
    data.write_bytes(before.replace(b"0", b"1", 1))  # the same size, written again
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    with pytest.raises(PartyDataChanged, match=f"cannot resume at step 3 from .*: {data} was "
                                               "modified at .*, after the run read it"):
        _restore(load_bottom(cfg, 2), run, plan, True, cfg)


def test_a_party_started_to_resume_refuses_a_label_party_starting_afresh(tmp_path: Path) -> None:
    """Passive parties started with --resume runs/exp1 joined a label party started anew
    (--run-dir runs/exp2): they trained run exp2 into runs/exp1, pruning the checkpoints of the
    run they were to resume and replacing its bottom model, without a word."""
    from passive_party.client import PartyError, _restore, load_bottom
    from splitleak.v1 import split_learning_pb2 as pb

    cfg = spam_config(tmp_path, str(spam_file(tmp_path / "spam.data", seed=0)))
    run = RunDir(tmp_path / "runs" / "exp1")
    fresh = pb.TrainingPlan(run_id="exp2", resumed=False)
    with pytest.raises(PartyError, match=f"started with --resume {run.root}, but the label party "
                                         "starts run exp2 afresh: start the label party with "
                                         "--resume too, or this party with --run-dir"):
        _restore(load_bottom(cfg, 1), run, fresh, True, cfg)
    _restore(load_bottom(cfg, 1), run, fresh, False, cfg)  # a new run: nothing to restore
