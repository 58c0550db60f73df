"""A run directory's artifacts that cannot be read, given to `attacker analyze` and `splitleak
compare`: exit 2 with one message naming the file (and line or field) and what is wrong, never
a traceback, never a silent result; a torn last metrics line (a crash mid-write) stays skipped."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attacker.cli import main as attacker_main
from orchestration.cli import main as splitleak_main
from splitleak.artifacts.sweep import SCHEMA, SweepIndexError, read_index_rows
from tests.conftest import small_config
from tests.test_cli_refusals import exit_code_and_text

METRICS = "label_party/metrics.jsonl"
INDEX = "attacker/gradients/index.json"
SHARD = "attacker/gradients/party_1/shard-000000.arrows"
OUTCOME = "label_party/outcome.json"
SUMMARY = "report/summary.json"


@pytest.fixture(scope="module")
def analysed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny in-process run (3 train steps), analysed with its report: what both commands read."""
    from attacker.analysis.analyze import analyze
    from attacker.analysis.summary import write_summary
    from attacker.report.report import write_report
    from tests.runs import reference_run

    root = tmp_path_factory.mktemp("analysed")
    run = reference_run(small_config(root, training={"epochs": 1, "max_steps": 3}))
    summary = analyze(run.root)
    write_report(run, summary)
    write_summary(run, summary)
    return run.root


def _metrics_line(run: Path, number: int, text: str) -> None:
    lines = (run / METRICS).read_text().splitlines(keepends=True)
    lines[number - 1] = text
    (run / METRICS).write_text("".join(lines))


def _index_party(run: Path, key: str) -> None:
    index = json.loads((run / INDEX).read_text())
    index["parties"] = {key: next(iter(index["parties"].values()))}
    (run / INDEX).write_text(json.dumps(index))


def _replace(run: Path, relative: str, content: bytes | None) -> None:
    """`relative` holding `content`, or a directory in its place (None)."""
    path = run / relative
    path.unlink()
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)


CORRUPTIONS = {
    "metrics a directory": lambda r: _replace(r, METRICS, None),
    "metrics binary": lambda r: _replace(r, METRICS, b"\xff\xfe\x00garbage{{"),
    "metrics a list": lambda r: _metrics_line(r, 2, "[1,2]\n"),
    "metrics a string loss": lambda r: _metrics_line(
        r, 2, json.dumps({"type": "train", "epoch": 0, "step": 0, "loss": "abc"}) + "\n"),
    "metrics a bad last line": lambda r: _metrics_line(r, len((r / METRICS).read_text().splitlines()),
                                                       '{"type":"eval"\n'),
    "outcome garbage": lambda r: _replace(r, OUTCOME, b"\xff\xfegarbage{{"),
    "outcome a directory": lambda r: _replace(r, OUTCOME, None),
    "config empty": lambda r: _replace(r, "config.toml", b""),
}
NEEDLES = {
    "metrics a directory": ("metrics.jsonl", "cannot read"),
    "metrics binary": ("metrics.jsonl line 1", "JSON record"),
    "metrics a list": ("metrics.jsonl line 2", "JSON object"),
    "metrics a string loss": ("metrics.jsonl line 2", "'loss' must be a number"),
    "metrics a bad last line": ("metrics.jsonl line ", "not a JSON record"),
    "outcome garbage": ("outcome.json", "not a readable outcome"),
    "outcome a directory": ("outcome.json", "cannot read"),
    "config empty": ("config.toml", "is empty"),
    "shard a directory": ("shard-000000.arrows", "cannot read"),
    "summary a directory": ("summary.json", "cannot read"),
    "summary empty": ("summary.json", "not a readable leak summary"),
    "summary null": ("summary.json", "not a readable leak summary"),
    "summary a list": ("summary.json", "not a readable leak summary"),
    "summary wrong types": ("summary.json", "field num_classes"),
    "metrics missing": ("metrics.jsonl", "no label_party"),
    "summary from a newer splitleak": ("summary.json", "version 99 is newer than the 1 this "
                                       "splitleak reads"),
}
ANALYZE_ONLY = {
    "shard a directory": lambda r: _replace(r, SHARD, None),
}
COMPARE_ONLY = {
    "summary a directory": lambda r: _replace(r, SUMMARY, None),
    "summary empty": lambda r: _replace(r, SUMMARY, b""),
    "summary null": lambda r: _replace(r, SUMMARY, b"null"),
    "summary a list": lambda r: _replace(r, SUMMARY, b"[]"),
    "summary wrong types": lambda r: _replace(r, SUMMARY, b'{"num_classes": "x", "leak": []}'),
    "metrics missing": lambda r: (r / METRICS).unlink(),
    # read as if it were this version's layout before
    "summary from a newer splitleak": lambda r: _replace(
        r, SUMMARY, (r / SUMMARY).read_bytes().replace(b'"schema_version": 1', b'"schema_version": 99')),
}


def _copy(analysed_run: Path, tmp_path: Path, corruption: str) -> Path:
    run = tmp_path / "run"
    shutil.copytree(analysed_run, run)
    {**CORRUPTIONS, **ANALYZE_ONLY, **COMPARE_ONLY}[corruption](run)
    return run


def _assert_refused(code: int, text: str, corruption: str) -> None:
    assert code == 2, text
    assert "Traceback" not in text, text
    for needle in NEEDLES[corruption]:
        assert needle in text, text


@pytest.mark.parametrize("corruption", [*CORRUPTIONS, *ANALYZE_ONLY])
def test_analyze_refuses_an_unreadable_artifact_naming_it(
        analysed_run: Path, tmp_path: Path, corruption: str, capsys: pytest.CaptureFixture) -> None:
    run = _copy(analysed_run, tmp_path, corruption)
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run)], capsys)
    _assert_refused(code, text, corruption)
    assert "cannot write" not in text, text


@pytest.mark.parametrize("corruption", [*CORRUPTIONS, *COMPARE_ONLY])
def test_compare_refuses_a_named_run_it_cannot_read(
        analysed_run: Path, tmp_path: Path, corruption: str, capsys: pytest.CaptureFixture) -> None:
    run = _copy(analysed_run, tmp_path, corruption)
    code, text = exit_code_and_text(
        splitleak_main, ["compare", str(run), "--output-dir", str(tmp_path / "compare")], capsys)
    _assert_refused(code, text, corruption)
    assert len(text.strip().splitlines()) == 1, text


def test_compare_reads_the_good_run_and_skips_a_bad_one_inside_a_directory(
        analysed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(analysed_run, runs / "good")
    shutil.copytree(analysed_run, runs / "bad")
    _replace(runs / "bad", SUMMARY, b"null")
    code, text = exit_code_and_text(
        splitleak_main, ["compare", str(runs), "--output-dir", str(tmp_path / "compare")], capsys)
    assert code == 0, text
    assert "skipped:" in text and "bad/report/summary.json" in text.replace("\n", ""), text


def test_a_missing_shard_is_warned_of_by_name(analysed_run: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    """A shard the index lists is gone: warned of by name, the shards there are analysed."""
    run = tmp_path / "run"
    shutil.copytree(analysed_run, run)
    index = json.loads((run / INDEX).read_text())
    index["parties"]["1"]["shards"].append({"file": "party_1/shard-000007.arrows", "records": 2,
                                            "rows": 128})
    (run / INDEX).write_text(json.dumps(index))
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run)], capsys)
    assert code == 0, text
    assert "shard-000007.arrows" in text and "missing" in text, text


def _log_files(run: Path) -> dict[str, bytes | None]:
    """Every path under the run's gradient log, with its bytes (None: a directory)."""
    root = run / "attacker" / "gradients"
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in root.rglob("*")}


def test_a_torn_shard_is_analysed_as_it_is_and_never_cut(
        analysed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The analysis reads a log, it never repairs it: a torn shard keeps every byte."""
    from attacker.sidecar.store import _prefix

    run = tmp_path / "run"
    shutil.copytree(analysed_run, run)
    shard = run / SHARD
    whole = _prefix(shard, before_step=1).end
    size = whole + (shard.stat().st_size - whole) // 4  # cut in the middle of the next record
    os.truncate(shard, size)
    before = _log_files(run)
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run)], capsys)
    assert code == 0, text
    assert _log_files(run) == before
    flat = text.replace("\n", "")
    assert "shard-000000.arrows: unreadable after 1 complete record(s)" in flat, text
    assert "missing" not in text and "cut back" not in text, text
    warnings = json.loads((run / SUMMARY).read_text())["warnings"]
    assert sum("shard-000000.arrows" in w for w in warnings) == 1, warnings


def test_nan_gradients_are_left_out_naming_shard_party_and_step(
        analysed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """0xff bytes over recorded gradients (NaN): that batch is left out and counted, by name."""
    from attacker.sidecar.store import GradientLog

    run = tmp_path / "run"
    shutil.copytree(analysed_run, run)
    step1 = [b for b in GradientLog(run / "attacker" / "gradients").batches(1) if b.step == 1][0]
    data = bytearray((run / SHARD).read_bytes())
    at = bytes(data).index(step1.tensors["cut_gradient"][0].tobytes())
    data[at:at + 64] = b"\xff" * 64
    (run / SHARD).write_bytes(bytes(data))
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run)], capsys)
    assert code == 0, text
    flat = text.replace("\n", "")
    assert "shard-000000.arrows: 1 record(s) of party 1 hold NaN or Inf gradients (step 1)" in flat, text
    steps = set(pq.read_table(run / "attacker" / "leak.parquet").column("step").to_pylist())
    assert 1 not in steps and 0 in steps


@pytest.mark.parametrize("damage", ["index party abc", "index a directory", "index garbage"])
def test_an_unreadable_index_is_read_around(analysed_run: Path, tmp_path: Path, damage: str,
                                            capsys: pytest.CaptureFixture) -> None:
    """The shards hold the log; the index only lists them: the analysis reads them anyway, with
    one warning naming the index, and leaves the index as it is (reading writes nothing)."""
    run = tmp_path / "run"
    shutil.copytree(analysed_run, run)
    {"index party abc": lambda r: _index_party(r, "abc"),
     "index a directory": lambda r: _replace(r, INDEX, None),
     "index garbage": lambda r: _replace(r, INDEX, b"\xff{garbage")}[damage](run)
    before = _log_files(run)
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run)], capsys)
    assert code == 0, text
    assert "index.json" in text and "read from its shards" in text.replace("\n", ""), text
    assert _log_files(run) == before
    again = pq.read_table(run / "attacker" / "leak.parquet")
    assert again.equals(pq.read_table(analysed_run / "attacker" / "leak.parquet"))
    assert json.loads((run / SUMMARY).read_text())["run_id"] == "run"  # from the run directory


def test_a_torn_last_metrics_line_is_still_skipped(analysed_run: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    shutil.copytree(analysed_run, run)
    with (run / METRICS).open("a") as f:
        f.write('{"type":"train","epoch":0,"st')  # a crash mid-write: no newline
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run)], capsys)
    assert code == 0, text
    assert "cut short" not in text and "partial" not in text, text  # every step is there


def test_a_sweep_index_of_null_rows_names_the_file_row_and_field(tmp_path: Path) -> None:
    rows = [{name: None for name in SCHEMA.names}]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp_path / "sweep.parquet")
    with pytest.raises(SweepIndexError) as refused:
        read_index_rows(tmp_path)
    message = str(refused.value)
    assert "sweep.parquet row 0: field point" in message and "\n" not in message, message


def _outputs(run: Path) -> dict[str, bytes]:
    """What an analysis writes, with its bytes: leak.parquet, rows.parquet and report/."""
    written = [run / "attacker" / "leak.parquet", run / "attacker" / "rows.parquet",
               *sorted((run / "report").iterdir())]
    return {str(p.relative_to(run)): p.read_bytes() for p in written if p.is_file()}


UNREADABLE_LOGS = {
    "shard compressed": lambda r: os.rename(r / SHARD, r / (SHARD + ".gz")),
    "party folder gone": lambda r: shutil.rmtree((r / SHARD).parent),
    "shard empty": lambda r: _replace(r, SHARD, b""),
    "shard garbage": lambda r: _replace(r, SHARD, b"\xff\xfegarbage" * 40),
    "shard schema only": lambda r: os.truncate(r / SHARD, _schema_end(r / SHARD)),
}


def _schema_end(shard: Path) -> int:
    from attacker.sidecar.store import _prefix

    return _prefix(shard, before_step=0).end


@pytest.mark.parametrize("damage", UNREADABLE_LOGS)
def test_a_log_with_no_readable_record_is_refused_and_the_results_are_kept(
        analysed_run: Path, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture) -> None:
    """Every shard of the log missing, compressed, empty or damaged: nothing to analyse, as for
    a run with no log at all; the previous leak files and report stay as they were."""
    run = tmp_path / "run"
    shutil.copytree(analysed_run, run)
    before = _outputs(run)
    UNREADABLE_LOGS[damage](run)
    log = _log_files(run)
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run)], capsys)
    assert code == 2, text
    flat = text.replace("\n", "")
    assert "Traceback" not in flat and "nothing to analyse" in flat, text
    assert "shard-000000.arrows" in flat, text
    assert _outputs(run) == before and _log_files(run) == log


def test_a_shard_saved_twice_is_refused_and_the_results_are_kept(
        analysed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A copy of a shard under the next shard's name would analyse every batch twice."""
    run = tmp_path / "run"
    shutil.copytree(analysed_run, run)
    before = _outputs(run)
    shutil.copy(run / SHARD, run / SHARD.replace("000000", "000001"))
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run)], capsys)
    assert code == 2, text
    flat = text.replace("\n", "")
    assert "Traceback" not in flat and "logged twice" in flat, text
    assert "shard-000000.arrows and in " in flat and "shard-000001.arrows" in flat, text
    assert _outputs(run) == before


def _cut_metrics_after_first_train_record(run: Path) -> None:
    """metrics.jsonl cut in the middle of its second train record (torn, or copied early)."""
    text = (run / METRICS).read_text()
    first = text.index('"type":"train"')
    second = text.index('"type":"train"', text.index("\n", first))
    (run / METRICS).write_text(text[:second + 10])


@pytest.mark.parametrize("told_by", ["outcome", "gradient log"])
def test_a_finished_run_whose_metrics_end_early_is_analysed_as_partial(
        analysed_run: Path, tmp_path: Path, told_by: str, capsys: pytest.CaptureFixture) -> None:
    """outcome.json says ok after 3 train steps (or the log holds 3 batches) but metrics.jsonl
    ends after the first: warned of, naming the file, and its last evaluation is not 'final'."""
    run = tmp_path / "run"
    shutil.copytree(analysed_run, run)
    _cut_metrics_after_first_train_record(run)
    if told_by == "gradient log":
        outcome = json.loads((run / OUTCOME).read_text())
        del outcome["train_steps"]
        (run / OUTCOME).write_text(json.dumps(outcome))
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run)], capsys)
    assert code == 0, text
    flat = " ".join(text.split())
    assert "metrics.jsonl ends at train step 0" in flat, text
    assert ("after 3 train steps" if told_by == "outcome" else "batches up to step 2") in flat, text
    summary = json.loads((run / SUMMARY).read_text())
    assert summary["partial"]["train_steps_done"] == 1
    report = (run / "report" / "report.md").read_text()
    assert "Partial run" in report and "Final" not in report, report


def test_a_finished_run_with_every_train_record_is_not_partial(analysed_run: Path) -> None:
    summary = json.loads((analysed_run / SUMMARY).read_text())
    assert summary["partial"] is None and not any("ends at train step" in w
                                                  for w in summary["warnings"])


@pytest.mark.parametrize("error", [ValueError("operands could not be broadcast together"),
                                   pa.ArrowInvalid("Invalid cast")])
def test_an_error_of_the_analysis_itself_is_no_bad_input(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        error: Exception) -> None:
    """A plain ValueError (numpy's, sklearn's, pyarrow's ArrowInvalid) raised inside an attack
    exited 2 as bad input; it is the analysis failing: exit 1, said in a sentence naming the
    error, no traceback."""
    import attacker.report.pipeline as pipeline

    def fail(*args: object) -> None:
        raise error

    monkeypatch.setattr(pipeline, "analyse_and_report", fail)
    assert attacker_main(["analyze", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "failed" in out.out and type(error).__name__ in out.out and "Traceback" not in out.out + out.err


@pytest.mark.parametrize("error", ["AnalysisInputError", "LogFormatError", "RecordError",
                                   "LogIndexError", "ManifestError", "MetricsError",
                                   "OutcomeError", "SummaryError", "ConfigError", "DatasetError",
                                   "FileNotFoundError"])
def test_an_unreadable_input_named_by_its_class_is_bad_input(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        error: str) -> None:
    import attacker.report.pipeline as pipeline
    from attacker.cli import _input_errors

    found = next(kind for kind in _input_errors() if kind.__name__ == error)

    def fail(*args: object) -> None:
        raise found("cannot read it")

    monkeypatch.setattr(pipeline, "analyse_and_report", fail)
    code, text = exit_code_and_text(attacker_main, ["analyze", str(tmp_path)], capsys)
    assert code == 2 and "cannot read it" in text, text


def test_a_tapped_runs_missing_gradient_log_is_refused_and_its_results_kept(
        analysed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """With attacker/gradients gone, a re-analysis with a run-level attack warned 'no gradient
    log (no party was tapped)' of a run whose party 1 was tapped, and replaced its results by
    model completion's alone."""
    run = tmp_path / "run"
    shutil.copytree(analysed_run, run)
    shutil.rmtree(run / "attacker" / "gradients")
    before = (run / SUMMARY).read_bytes()
    code, text = exit_code_and_text(
        attacker_main, ["analyze", str(run), "--attacks", "norm", "model_completion", "--jobs", "1"],
        capsys)
    flat = " ".join(text.split())
    assert code == 2, text
    assert f"no gradient log at {run / 'attacker' / 'gradients'}, though the run's threat model " \
           "taps party 1 and it trained 3 step(s)" in flat, text
    assert "no party was tapped" not in flat and "Traceback" not in text, text
    assert (run / SUMMARY).read_bytes() == before
