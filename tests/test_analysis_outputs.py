"""What `attacker analyze` leaves in a run directory: a finished analysis replaces every file of
the previous one, a failed or stopped one (Ctrl-C) none of them; one analysis of a run at a time;
missing inputs are bad input (exit 2)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from attacker.cli import main as attacker_main
from attacker.report import pipeline
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import holding
from tests.conftest import small_config
from tests.test_cli_refusals import exit_code_and_text

OUTPUTS = ("attacker", "report")  # the folders an analysis writes


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny in-process run (3 train steps), analysed by `attacker analyze` as its config says."""
    from tests.runs import reference_run

    root = tmp_path_factory.mktemp("analysed")
    run = reference_run(small_config(root, training={"epochs": 1, "max_steps": 3}))
    assert attacker_main(["analyze", str(run.root), "--jobs", "1"]) == 0
    return run.root


@pytest.fixture
def run(analysed: Path, tmp_path: Path) -> RunDir:
    copy = tmp_path / analysed.name
    shutil.copytree(analysed, copy)
    return RunDir(copy)


def _files(run: RunDir) -> dict[str, bytes]:
    """Every file an analysis writes (and the gradient log), by its path in the run."""
    return {str(p.relative_to(run.root)): p.read_bytes() for folder in OUTPUTS
            for p in sorted((run.root / folder).rglob("*")) if p.is_file()}


def _analyse(run: RunDir, capsys: pytest.CaptureFixture, *options: str) -> tuple[int, str]:
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run.root), "--jobs", "1",
                                                    *options], capsys)
    return code, " ".join(text.split())


def _leak_attacks(run: RunDir) -> set[str]:
    return set(pq.read_table(run.leak, columns=["attack"]).column("attack").to_pylist())


def _summary_attacks(run: RunDir) -> set[str]:
    return {e["attack"] for e in json.loads(run.leak_summary.read_text())["leak"]}


def test_a_failed_reanalysis_leaves_every_previous_file_as_it_was(
        run: RunDir, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _files(run)
    assert any(name.endswith(".png") for name in before) and "attacker/rows.parquet" in before

    def full(run_: RunDir, summary: dict, out: object) -> None:  # the summary's disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run_.leak_summary))

    monkeypatch.setattr(pipeline, "write_summary", full)
    code, text = _analyse(run, capsys, "--attacks", "norm")
    assert code == 2, text
    assert (f"cannot write {run.leak_summary}: No space left on device (the disk or the "
            "file-size limit is full)") in text, text
    assert _files(run) == before


@pytest.mark.parametrize(("code", "meaning"), [
    (errno.EROFS, "its file system is mounted read-only"),
    (errno.EACCES, "this user may not write there"),
    (errno.ENAMETOOLONG, "longer than its file system allows"),
])
def test_a_failed_write_says_what_happened_and_leaves_every_previous_file(
        run: RunDir, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, code: int,
        meaning: str) -> None:
    """A read-only file system, a permission error and a name too long all read "cannot write
    FILE: REASON" with nothing more, as a full disk did not: each now says what it means."""
    before = _files(run)

    def refused(run_: RunDir, summary: dict, out: object) -> None:
        raise OSError(code, os.strerror(code), str(run_.leak_summary))

    monkeypatch.setattr(pipeline, "write_summary", refused)
    code_, text = _analyse(run, capsys, "--attacks", "norm")
    assert code_ == 2, text
    assert f"cannot write {run.leak_summary}: {os.strerror(code)} (" in text, text
    assert meaning in text, text
    assert _files(run) == before


def test_ctrl_c_leaves_every_previous_file_and_says_so(
        run: RunDir, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _files(run)

    def stopped(*args: object) -> None:  # Ctrl-C once the new leak files are written
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "write_report", stopped)
    code, text = _analyse(run, capsys, "--attacks", "norm")
    assert code == 130
    assert "stopped by Ctrl-C: the run's previous analysis (leak files, report, summary) is as " \
        "it was" in text
    assert _files(run) == before


def test_sigterm_is_ctrl_c_exit_143_every_previous_file_kept(
        run: RunDir, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM to `attacker analyze` (a scheduler's stop, `timeout`) killed it silently: no
    word, its staging folders (attacker/.analysis-*, report/.analysis-*) left behind, where
    commands.md promises 143 and the previous analysis said to be as it was, as on Ctrl-C."""
    import signal

    before = _files(run)

    def terminated(*args: object) -> None:  # SIGTERM once the new leak files are written
        os.kill(os.getpid(), signal.SIGTERM)

    def unhandled(*args: object) -> None:  # in place of the default, which would end pytest
        raise AssertionError("attacker analyze left SIGTERM unhandled")

    monkeypatch.setattr(pipeline, "write_report", terminated)
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        code, text = _analyse(run, capsys, "--attacks", "norm")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 143, text
    assert "stopped by SIGTERM: the run's previous analysis (leak files, report, summary) is as " \
        "it was" in " ".join(text.split())
    assert _files(run) == before
    assert not list(run.root.rglob(".analysis-*"))


def test_a_finished_reanalysis_replaces_every_file_and_keeps_the_users_own(
        run: RunDir, capsys: pytest.CaptureFixture) -> None:
    mine = run.report / "notes.md"
    mine.write_text("my notes")
    stale = run.report / "leak_party9_cut.png"  # a plot no analysis of this run draws
    stale.write_bytes(b"old")
    abandoned = run.attacker / ".analysis-killed"  # what an analysis killed by SIGKILL left
    abandoned.mkdir()
    (abandoned / "leak.parquet").write_bytes(b"half")
    code, text = _analyse(run, capsys, "--attacks", "norm")
    assert code == 0, text
    assert _leak_attacks(run) == _summary_attacks(run) == {"norm"}
    assert "| norm |" in run.report_md.read_text()
    assert mine.read_text() == "my notes" and not stale.exists()
    assert not [p for folder in OUTPUTS for p in (run.root / folder).glob(".*")
                if p.name != ".gitignore"], "a staging or temporary file was left behind"


def test_a_second_analysis_of_a_run_is_refused_naming_the_first(
        run: RunDir, capsys: pytest.CaptureFixture) -> None:
    before = _files(run)
    with holding(run.lock, run.root, "analysing it"):  # as another process's analysis holds it
        code, text = _analyse(run, capsys, "--attacks", "norm")
    assert code == 2, text
    assert f"is in use by another splitleak process (pid {os.getpid()})" in text
    assert _files(run) == before


@pytest.mark.parametrize("writer", ["analyze", "write_report", "write_summary"])
def test_the_public_writers_take_the_runs_lock(run: RunDir, writer: str) -> None:
    """analyze, write_report and write_summary without a staging wrote without run.lock: a
    concurrent `attacker analyze` removed their staging folder mid-write as abandoned. Now
    each is refused while another process holds the lock, the run's files as they were, and
    the abandoned staging of a killed analysis goes once it holds it."""
    from attacker.analysis.analyze import analyze
    from attacker.analysis.summary import write_summary
    from attacker.report.report import write_report
    from splitleak.artifacts.rundir import RunInUse

    summary = json.loads(run.leak_summary.read_text())
    write = {"analyze": lambda: analyze(run.root, [("norm", {})]),
             "write_report": lambda: write_report(run, dict(summary)),
             "write_summary": lambda: write_summary(run, dict(summary))}[writer]
    before = _files(run)
    with holding(run.lock, run.root, "analysing it"), pytest.raises(RunInUse):
        write()
    assert _files(run) == before
    abandoned = run.report / ".analysis-killed"
    abandoned.mkdir()
    write()
    assert not abandoned.exists()


def test_a_directory_in_place_of_an_output_is_named(
        run: RunDir, capsys: pytest.CaptureFixture) -> None:
    run.leak.unlink()
    run.leak.mkdir()
    before = _files(run)
    code, text = _analyse(run, capsys)
    assert code == 2, text
    assert f"cannot write {run.leak}: Is a directory" in text and ".tmp" not in text
    assert _files(run) == before


@pytest.mark.parametrize("missing", ["label_party/labels.parquet", "attacker/gradients"])
def test_a_missing_input_is_bad_input(run: RunDir, capsys: pytest.CaptureFixture,
                                      missing: str) -> None:
    path = run.root / missing
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    before = _files(run)
    code, text = _analyse(run, capsys)
    assert code == 2, text
    assert f"cannot analyse {run.root}:" in text and "Traceback" not in text
    assert _files(run) == before


def test_a_folder_that_cannot_be_written_is_refused_before_the_analysis(
        run: RunDir, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from attacker.analysis import staging

    make = staging.tempfile.mkdtemp

    def read_only(prefix: str, dir: Path) -> str:  # noqa: A002 - as tempfile names it
        if dir == run.report:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), f"{dir}/{prefix}x")
        return make(prefix=prefix, dir=dir)

    def analysed(*args: object) -> None:
        raise AssertionError("analysed, then refused")

    monkeypatch.setattr(staging.tempfile, "mkdtemp", read_only)
    monkeypatch.setattr(pipeline, "analyze", analysed)
    before = _files(run)
    code, text = _analyse(run, capsys)
    assert code == 2, text
    assert f"cannot write {run.report}: Permission denied" in text
    assert _files(run) == before


def _disk_full_at_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fig: object, path: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr("attacker.report.plots._save", full)


def test_a_full_disk_at_a_plot_stops_the_analysis_without_a_traceback(
        run: RunDir, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A plot that finds the disk full was logged with a traceback and the report went on (to
    fail at its next file); it now stops the analysis at once: exit 2, one sentence."""
    before = _files(run)
    _disk_full_at_plots(monkeypatch)
    code, text = _analyse(run, capsys, "--attacks", "norm")
    assert code == 2 and "No space left on device" in text, text
    assert "Traceback" not in text + caplog.text and "plot" not in caplog.text, caplog.text
    assert _files(run) == before


def test_splitleak_run_whose_analysis_fails_or_stops_says_the_training_is_done(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """`splitleak run` whose analysis found the disk full ended with a traceback (exit 1), and
    one whose analysis was stopped by Ctrl-C said only "every party was stopped": both now say
    the training is done and that `attacker analyze RUN` writes the analysis."""
    from orchestration.cli import main as splitleak_main
    from tests.conftest import write_config

    config = write_config(tmp_path, small_config(tmp_path, training={"epochs": 1, "max_steps": 3}))
    _disk_full_at_plots(monkeypatch)
    code, text = exit_code_and_text(splitleak_main, ["run", str(config), "--in-process",
                                                     "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 2 and "Traceback" not in text, text
    assert "training finished, but its analysis could not be written: cannot write" in text, text
    assert "No space left on device" in text and "attacker analyze" in text, text
    monkeypatch.undo()

    def stopped(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "write_report", stopped)
    code, text = exit_code_and_text(splitleak_main, ["run", str(config), "--in-process",
                                                     "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 130, text
    assert "training finished; its analysis was stopped: attacker analyze" in text, text
