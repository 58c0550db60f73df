"""A sweep re-run from another working directory, where a relative data path names another
file, is refused once, up front, naming the folder it ran from: no point runs on other data
nor fails one by one (orchestration.sweep.workdir)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from orchestration.cli import main
from orchestration.sweep.command import sweep_points
from orchestration.sweep.points import Point
from orchestration.sweep.spec import load_sweep
from orchestration.sweep.workdir import check_working_directory
from splitleak.artifacts.paths import SweepDir
from splitleak.cli_common import BadInput
from tests.conftest import small_config
from tests.test_cli_refusals import exit_code_and_text
from tests.test_resume_data import spam_file
from tests.test_sweep_resume_refused import started_in_a  # noqa: F401 - a fixture


def test_a_sweep_run_again_from_another_folder_is_refused_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    a, b = tmp_path / "A", tmp_path / "B"
    spam_file(a / "spam.data", seed=0)
    spam_file(b / "spam.data", seed=1)
    (a / "exp.toml").write_text(tomli_w.dumps(small_config(
        tmp_path, dataset={"name": "spambase", "params": {"path": "spam.data"}},
        features={"passive": [[0, 28], [28, 57]]})))
    sweep_file = a / "sweep.toml"
    sweep_file.write_text(tomli_w.dumps({"sweep": {
        "name": "wd", "base": "exp.toml", "output_dir": str(tmp_path / "sweeps"),
        "seeds": [0, 1, 2]}}))
    sweep_dir = tmp_path / "sweeps" / "wd"
    monkeypatch.chdir(a)  # the sweep starts in A (as `splitleak sweep` records it)
    check_working_directory(sweep_dir, sweep_points(load_sweep(sweep_file), sweep_file, sweep_dir))
    recorded = SweepDir(sweep_dir).data_paths.read_text()

    monkeypatch.chdir(b)  # and is run again from B, which holds another spam.data
    code, text = exit_code_and_text(main, ["sweep", str(sweep_file), "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 2 and "Traceback" not in text, text
    assert text.count("was run from") == 1, text
    assert f"was run from {a}" in text and f"names {b / 'spam.data'}" in text, text
    assert "3 of 3 points differ" in text and "nothing was run" in text, text
    assert sorted(p.name for p in sweep_dir.iterdir()) == ["data_paths.json", "sweep.lock"]
    assert SweepDir(sweep_dir).data_paths.read_text() == recorded

    monkeypatch.chdir(a)  # from A again it goes on
    check_working_directory(sweep_dir, sweep_points(load_sweep(sweep_file), sweep_file, sweep_dir))


def test_absolute_data_paths_run_from_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    data = spam_file(tmp_path / "spam.data", seed=0)
    (tmp_path / "exp.toml").write_text(tomli_w.dumps(small_config(
        tmp_path, dataset={"name": "spambase", "params": {"path": str(data)}},
        features={"passive": [[0, 28], [28, 57]]})))
    sweep_file = tmp_path / "sweep.toml"
    sweep_file.write_text(tomli_w.dumps({"sweep": {"name": "wd", "base": "exp.toml"}}))
    sweep_dir = tmp_path / "sweeps" / "wd"
    for folder in (tmp_path, tmp_path / "elsewhere"):
        folder.mkdir(exist_ok=True)
        monkeypatch.chdir(folder)
        check_working_directory(sweep_dir, sweep_points(load_sweep(sweep_file), sweep_file,
                                                        sweep_dir))


def test_a_sweep_without_a_record_is_refused_by_its_checkpoints(
        started_in_a, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 - the fixture
        capsys: pytest.CaptureFixture) -> None:
    """A sweep run before data_paths.json existed: its points' checkpoints say where they read."""
    cfg, run, base = started_in_a
    point = Point(0, "v", (), (), cfg, run.root)
    monkeypatch.chdir(base / "B")
    with pytest.raises(BadInput) as caught:
        check_working_directory(base / "sweep", [point])
    text = " ".join(capsys.readouterr().err.split())
    assert caught.value.code == 2, text
    assert "was run from another folder" in text and str(base / "A" / "spam.data") in text, text
    assert f"names {base / 'B' / 'spam.data'}" in text and "1 of 1 points differ" in text, text
    assert not (base / "sweep").exists()
    # the way out it names, where the data itself moved: that point's run directory
    assert f"if the data itself moved, remove the run directories of the unfinished points " \
        f"whose checkpoints name the old files ({run.root})" in text, text
    monkeypatch.chdir(base / "A")
    check_working_directory(base / "sweep", [point])


def test_the_way_out_it_names_for_moved_data_lets_the_sweep_go_on(
        started_in_a, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 - the fixture
        capsys: pytest.CaptureFixture) -> None:
    """It said 'remove data_paths.json', after which the unfinished point's checkpoint refused
    the sweep again, without a way out: it now names that point's run directory too."""
    import shutil

    cfg, run, base = started_in_a
    point = Point(0, "v", (), (), cfg, run.root)
    check_working_directory(base / "sweep", [point])  # recorded from A
    monkeypatch.chdir(base / "B")
    with pytest.raises(BadInput):
        check_working_directory(base / "sweep", [point])
    text = " ".join(capsys.readouterr().err.split())
    record = SweepDir(base / "sweep").data_paths
    assert f"remove {record} and the run directories of the unfinished points whose " \
        f"checkpoints name the old files ({run.root})" in text, text
    record.unlink()
    shutil.rmtree(run.root)
    check_working_directory(base / "sweep", [point])  # goes on, on B's data
