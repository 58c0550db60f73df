"""compare's inputs beside healthy runs: a summary without leak entries, a partial run, an edited
config, a premise that fails in one setting, a re-analysis with the config's own options, an
output directory inside a run, and labels several set-ups share."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestration.cli import main
from orchestration.compare.command import compare_and_print, summary_table
from orchestration.compare.read import find_runs
from orchestration.compare.table import Comparison, compare
from splitleak.artifacts.paths import RunDir
from splitleak.cli_common import BadInput
from tests.conftest import small_config
from tests.test_compare import fake_run, leak_entry

MARVELL = [{"name": "marvell", "s": 4.0}]


def _runs(tmp_path: Path, marvell_leak: list[dict[str, Any]] | None = None,
          **none_config: Any) -> tuple[Path, Path]:
    """A no-defense run and a Marvell run of one set-up and seed; Marvell leaks less at a
    utility cost of 0.005."""
    none = fake_run(tmp_path / "runs" / "none", small_config(tmp_path, **none_config), 0.95,
                    [leak_entry("norm", 0.90, 0.95)])
    marvell = fake_run(tmp_path / "runs" / "marvell", small_config(tmp_path, defense=MARVELL),
                       0.945, marvell_leak or [leak_entry("norm", 0.60, 0.65)])
    return none, marvell


def _compare(tmp_path: Path, *paths: Path, **options: Any) -> tuple[Comparison, str, str]:
    """compare_and_print's comparison, what it printed and the report.md it wrote."""
    printed = io.StringIO()
    out = tmp_path / "compare"
    comparison = compare_and_print(list(paths), out, Console(file=printed, width=400), **options)
    assert comparison is not None
    return comparison, " ".join(printed.getvalue().split()), (out / "report.md").read_text()


def _summary(run: Path, **fields: Any) -> None:
    path = RunDir(run).leak_summary
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_run_whose_summary_has_no_leak_entry_is_left_out_with_a_warning(tmp_path: Path) -> None:
    """It was dropped silently, and the verdict read as if the setting had been measured."""
    none, marvell = _runs(tmp_path)
    RunDir(marvell).leak_summary.write_text(json.dumps({"schema_version": 1}))
    comparison, printed, report = _compare(tmp_path, none, marvell)
    warning = f"{marvell}: its report/summary.json has no leak entry"
    assert warning in printed and warning in report
    assert f"Not in any verdict, as their summaries have no leak entry: {marvell}" in printed
    assert f"Not in any verdict, as their summaries have no leak entry: {marvell}" in report
    assert {r["setting"] for r in comparison.rows} == {"no defense"}


def test_runs_none_of_which_has_a_leak_entry_are_refused(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    none, marvell = _runs(tmp_path)
    for run in (none, marvell):
        _summary(run, leak=[])
    with pytest.raises(BadInput):
        _compare(tmp_path, none, marvell)
    assert "no compared run's report/summary.json has a leak entry" in capsys.readouterr().err


@pytest.mark.parametrize("code", [0, 1])
def test_a_sweep_whose_runs_have_no_leak_entry_keeps_the_sweeps_exit_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        code: int) -> None:
    """The closing comparison's refusal ended a completed sweep with exit 2, not the sweep's."""
    import argparse

    from orchestration import study
    from orchestration.sweep.command import SweepRun

    none, marvell = _runs(tmp_path)
    for run in (none, marvell):
        _summary(run, leak=[])
    monkeypatch.setattr(study, "cmd_sweep", lambda args, console: SweepRun(code, tmp_path, done=2))
    real = study.compare_and_print
    monkeypatch.setattr(study, "compare_and_print", lambda paths, out, console, **options: real(
        [none, marvell], tmp_path / "compare", console, **options))
    printed = io.StringIO()
    assert study.run_study(argparse.Namespace(no_compare=False),
                           Console(file=printed, width=400)) == code
    assert "no compared run's report/summary.json has a leak entry" in capsys.readouterr().err
    assert "the sweep's comparison was not written" in printed.getvalue()


@pytest.mark.parametrize(("signum", "code", "said"), [(signal.SIGINT, 130, "Ctrl-C"),
                                                     (signal.SIGTERM, 143, "SIGTERM")])
def test_a_sweep_stopped_while_comparing_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int, code: int, said: str) -> None:
    """Ctrl-C in the closing comparison ended the sweep with exit 130 and not a word (SIGTERM:
    with the handler of a run, not the sweep's words)."""
    import argparse

    from orchestration import study
    from orchestration.sweep.command import SweepRun

    def unhandled(signum: int, frame: object) -> None:  # not the pytest process's end
        raise AssertionError("the signal reached a handler outside the comparison's")

    previous = signal.signal(signal.SIGTERM, unhandled)

    def stopped(*args: object, **options: object) -> None:
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the signal's handler raises before this ends

    monkeypatch.setattr(study, "cmd_sweep", lambda args, console: SweepRun(0, tmp_path, done=2))
    monkeypatch.setattr(study, "compare_and_print", stopped)
    printed = io.StringIO()
    try:
        assert study.run_study(argparse.Namespace(no_compare=False),
                               Console(file=printed, width=400)) == code
    except KeyboardInterrupt:
        pytest.fail("the stop went past the sweep's comparison without a word")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (f"stopped by {said} while comparing: the sweep's points are kept as its index says, "
            f"its comparison was not written; run the same command again, or `splitleak compare "
            f"{tmp_path}`, to write it.") in printed.getvalue(), printed.getvalue()


@pytest.mark.parametrize("inside", ["report", ".", "report/deeper"])
def test_an_output_directory_in_a_run_directory_is_refused(
        tmp_path: Path, inside: str, capsys: pytest.CaptureFixture) -> None:
    """`--output-dir RUN/report` replaced the run's own report.md (exit 0)."""
    none, marvell = _runs(tmp_path)
    own = RunDir(marvell).report / "report.md"
    own.write_text("# Label-leak report: marvell\n")
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(none), str(marvell), "--output-dir", str(marvell / inside)])
    assert stop.value.code == 2
    assert f"{marvell} is a run directory" in " ".join(capsys.readouterr().err.split())
    assert own.read_text() == "# Label-leak report: marvell\n"
    assert not (marvell / "table.csv").exists() and not (marvell / "report" / "deeper").exists()


def test_a_report_compare_did_not_write_is_never_replaced(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    none, marvell = _runs(tmp_path)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "report.md").write_text("# my notes\n")
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(none), str(marvell), "--output-dir", str(notes)])
    assert stop.value.code == 2 and "is not a report `splitleak compare` wrote" in capsys.readouterr().err
    assert (notes / "report.md").read_text() == "# my notes\n"
    for _ in range(2):  # its own report it replaces
        assert main(["compare", str(none), str(marvell), "--output-dir", str(tmp_path / "c")]) == 0


@pytest.mark.parametrize("told_by", ["outcome", "summary"])
def test_a_partial_run_is_named(tmp_path: Path, told_by: str) -> None:
    none, marvell = _runs(tmp_path)
    if told_by == "outcome":
        RunDir(marvell).outcome.write_text(json.dumps({"status": "interrupted", "step": 40}))
    else:
        _summary(marvell, partial={"status": "interrupted", "step": 40})
    _, printed, report = _compare(tmp_path, none, marvell)
    warning = f"{marvell}: partial run (interrupted at step 40)"
    assert warning in printed and warning in report


def test_a_finished_run_whose_metrics_end_early_is_named_as_finished(tmp_path: Path) -> None:
    """It said "partial run (ok): ... before it stopped" of a run that finished."""
    none, marvell = _runs(tmp_path)
    message = ("label_party/metrics.jsonl ends at train step 0, though the run finished after "
               "3 train steps")
    _summary(marvell, partial={"status": "ok", "step": None, "train_steps_done": 1,
                               "train_steps_planned": 3, "message": message})
    _, printed, report = _compare(tmp_path, none, marvell)
    flat = " ".join(printed.split())
    assert f"{marvell}: {message}" in flat and f"{marvell}: {message}" in report
    assert "partial run (ok)" not in flat and "before it stopped" not in flat + report


def test_a_premise_that_fails_in_one_setting_gives_its_reason_and_no_verdict(tmp_path: Path) -> None:
    """It read "(not measured for marvell s=4: their summaries lack this attack)" under a verdict."""
    anchorless = {**leak_entry("cosine_oracle", 0.5, 0.5), "premise": "no clean anchor here"}
    none = fake_run(tmp_path / "runs" / "none", small_config(tmp_path), 0.95,
                    [leak_entry("norm", 0.9, 0.95), leak_entry("cosine_oracle", 0.9, 0.95)])
    marvell = fake_run(tmp_path / "runs" / "marvell", small_config(tmp_path, defense=MARVELL),
                       0.945, [leak_entry("norm", 0.6, 0.65), anchorless])
    comparison, printed, report = _compare(tmp_path, none, marvell)
    verdict = {v.attack: v.sentence() for v in comparison.verdicts()}
    assert verdict["cosine_oracle"] == ("cosine_oracle: no verdict, its premise fails for "
                                        "marvell s=4 (no clean anchor here)")
    assert verdict["norm"].startswith("norm: marvell s=4, leak 0.650")
    warning = "cosine_oracle: not scored for marvell s=4, its premise fails in its runs: no clean anchor here"
    assert warning in printed and warning in report
    assert "their summaries lack this attack" not in printed + report
    assert "marvell s=4 0.9450 0.739 0.650* skipped" in printed, printed  # not a bare '-'


def test_a_re_analysis_with_the_configs_own_options_is_no_re_analysis(tmp_path: Path) -> None:
    """`attacker analyze R --seed S --draws 5 --hints 1,3,5` with the config's own values was
    warned of as analysed unlike the other runs."""
    none, marvell = _runs(tmp_path)
    _summary(marvell, analysed_with={"seed": 3, "draws": 5, "hints": [1, 3, 5]})
    runs, _ = find_runs([none, marvell])
    assert not [w for w in compare(runs).warnings if "re-analysed" in w]
    _summary(marvell, analysed_with={"seed": 4, "draws": 5})
    runs, _ = find_runs([none, marvell])
    assert [w for w in compare(runs).warnings if "re-analysed with seed 4, unlike" in w]


def test_set_ups_of_one_label_keep_their_suffix_in_the_terminal(tmp_path: Path) -> None:
    """Three rows read "no defense": the [hash] suffix wrapped onto a line of its own."""
    none, _ = _runs(tmp_path)
    other = fake_run(tmp_path / "runs" / "none32", small_config(tmp_path, training={"batch_size": 32}),
                     0.96, [leak_entry("norm", 0.9, 0.97)])
    runs, _ = find_runs([none, other])
    comparison = compare(runs)
    printed = io.StringIO()
    Console(file=printed, width=60).print(summary_table(comparison, 60))
    labels = [s.label for s in comparison.settings if s.label.startswith("no defense")]
    assert len(labels) == 2 and all(label.replace(" [", "\u00a0[") in printed.getvalue()
                                    for label in labels)
    assert all(v.sentence().startswith("norm: no defense [") for v in comparison.verdicts())


def test_an_edited_config_is_warned_of_with_both_hashes(tmp_path: Path) -> None:
    """A config.toml edited after the run (marvell's s changed) was read silently."""
    from splitleak.api import open_run
    from splitleak.config import load_config

    none, marvell = _runs(tmp_path)
    config = RunDir(marvell).config
    recorded = load_config(config).hash
    config.write_text(config.read_text().replace("s = 4.0", "s = 2.0"))
    edited = load_config(config).hash
    _, printed, report = _compare(tmp_path, none, marvell)
    warning = f"{config}: its content hashes to {edited}, not to the hash {recorded} its header line records"
    assert warning in printed and warning in report
    with pytest.warns(UserWarning, match=f"hashes to {edited}, not to the hash {recorded}"):
        assert open_run(marvell).config.hash == edited


def test_a_skipped_run_is_named_in_the_report_too(tmp_path: Path) -> None:
    none, marvell = _runs(tmp_path)
    RunDir(marvell).leak_summary.unlink()
    _, printed, report = _compare(tmp_path, tmp_path / "runs")
    skipped = f"skipped: {marvell}: no report/summary.json"
    assert skipped in printed and skipped in report


def test_an_unreadable_outcome_is_refused_by_the_api_as_by_the_analysis(tmp_path: Path) -> None:
    """open_run(R).outcome read a garbage outcome.json as None ("while it runs")."""
    from splitleak.api import open_run
    from splitleak.artifacts.outcome import OutcomeError

    _, marvell = _runs(tmp_path)
    assert open_run(marvell).outcome is None
    RunDir(marvell).outcome.write_text("garbage")
    with pytest.raises(OutcomeError, match="outcome.json"):
        _ = open_run(marvell).outcome


def test_a_no_defense_verdict_names_the_setting_a_sweep_called_otherwise() -> None:
    from orchestration.compare.verdict import Verdict

    row = {"setting": "none", "baseline": "none", "leak_mean": 0.914}
    assert Verdict("norm", 0.01, row, row).sentence() == (
        "norm: no defense (none); none on the frontier within the budget leaks less than no "
        "defense (none)'s 0.914")


def _refused_exact(**extra: Any) -> dict[str, Any]:
    """A run-level attack's entry for a run it gave up on, as analysis/run_level.py writes it."""
    return {"scope": "run", "party_id": 1, "layer": "bottom", "attack": "exact", "name": "exact",
            "metric": "accuracy", "side_knowledge": "white box", "batches": 1, "skipped": 1,
            "family": "label_inference", "vflair": None,
            "error": "parties [1]: EXACT runs for one party declared white_box = true", **extra}


def test_a_run_level_attack_that_skipped_its_runs_is_named_with_its_reason(tmp_path: Path) -> None:
    """EXACT skipped in every run (its summary entry: skipped 1 and the error) read as a row of
    blanks at the bottom layer with 'no verdict, no setting has a paired run without a defense',
    and the DCS section said it was left out for having no VFLAIR counterpart; the reason was
    nowhere."""
    why = "parties [1]: EXACT runs for one party declared white_box = true"
    none = fake_run(tmp_path / "runs" / "none", small_config(tmp_path), 0.95,
                    [leak_entry("norm", 0.9, 0.95), _refused_exact()])
    marvell = fake_run(tmp_path / "runs" / "marvell", small_config(tmp_path, defense=MARVELL),
                       0.945, [leak_entry("norm", 0.6, 0.65), _refused_exact()])
    comparison, printed, report = _compare(tmp_path, none, marvell)
    warning = f"exact (party 1, bottom layer): not scored, skipped in these runs: {why}"
    assert warning in printed and warning in report
    assert "`exact`" not in report  # not listed among the attacks VFLAIR lacks, as if measured
    assert all(r["attack"] != "exact" for r in comparison.capability)
    comparison, printed, report = _compare(tmp_path, none, marvell, layer="bottom")
    assert not comparison.rows and "## exact" not in report
    warning = f"exact: not scored, its premise fails in these runs: {why}"
    assert warning in printed and warning in report
    assert "no setting has a paired run" not in printed + report


def test_a_run_still_running_is_named_as_such_not_sent_to_be_analysed(tmp_path: Path) -> None:
    """A run `splitleak run` was still training read 'no report/summary.json (run `attacker
    analyze` on it)', an analysis that is refused while the run holds its directory."""
    from splitleak.artifacts.rundir import holding

    none, marvell = _runs(tmp_path)
    RunDir(marvell).leak_summary.unlink()
    with holding(RunDir(marvell).lock, marvell, "comparing"):
        with pytest.raises(ValueError, match=r"no report/summary.json: it is still being run or "
                                             rf"analysed \(pid {os.getpid()} holds run.lock\); "
                                             "compare it once that has finished"):
            find_runs([none, marvell])
        _, warnings = find_runs([tmp_path / "runs"])
        assert any("still being run or analysed" in w for w in warnings)
    with pytest.raises(ValueError, match=r"no report/summary.json \(run `attacker analyze` on it\)"):
        find_runs([none, marvell])  # nothing holds it: killed before its analysis


def test_a_statistic_edited_into_a_string_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """flipped.p95 edited by hand to "0.65" read as no figure: the table showed '–' and the
    run had no verdict, unsaid."""
    edited = leak_entry("norm", 0.60, 0.65)
    edited["flipped"]["p95"] = "0.65"
    none, marvell = _runs(tmp_path, [edited])
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(none), str(marvell), "--output-dir", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{RunDir(marvell).leak_summary} is not a readable leak summary" in err, err
    assert "leak entry norm (party 1, cut layer, run): flipped.p95 is '0.65', not a number (a " \
           "number or null)" in err, err
    _, warnings = find_runs([tmp_path / "runs"])  # inside a directory: skipped, by name
    assert any("flipped.p95 is '0.65', not a number" in w for w in warnings)


@pytest.mark.parametrize("scope", ["run", "epoch", "collusion"])
def test_every_reader_of_a_summary_refuses_a_statistic_edited_into_a_string(
        tmp_path: Path, scope: str) -> None:
    """compare alone checked the statistics (its run-level entries of one party): open_run's
    summary read "0.65" (or an epoch's, a colluding group's) as it was, to be taken for no
    figure; the summary's model now refuses it for every reader, naming file, entry and value."""
    from splitleak.api import open_run
    from splitleak.artifacts.summary import SummaryError

    edited = leak_entry("norm", 0.60, 0.65)
    edited["flipped"]["p95"] = "0.65"
    if scope == "epoch":
        edited.update(scope="epoch", epoch=0)
    elif scope == "collusion":
        edited["parties"] = [1, 2]
    _, marvell = _runs(tmp_path, [edited])
    with pytest.raises(SummaryError) as refused:
        _ = open_run(marvell).summary
    said = " ".join(str(refused.value).split())
    shown = "run" if scope == "collusion" else scope
    assert said.startswith(f"{RunDir(marvell).leak_summary} is not a readable leak summary"), said
    assert f"leak entry norm (party 1, cut layer, {shown}): flipped.p95 is '0.65', not a " \
           "number (a number or null)" in said, said


@pytest.mark.parametrize("value", [0.9, "0.9", [0.9]])
def test_a_statistics_group_edited_into_a_value_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture, value: object) -> None:
    """"flipped": 0.9 in place of {"mean": .., "p95": ..} stopped splitleak compare with a
    traceback (AttributeError: 'float' object has no attribute 'get'); exit 2, one sentence."""
    edited = leak_entry("norm", 0.60, 0.65)
    edited["flipped"] = value
    none, marvell = _runs(tmp_path, [edited])
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(none), str(marvell), "--output-dir", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"leak entry norm (party 1, cut layer, run): flipped is {value!r}, not an object of " \
           "statistics" in err and "Traceback" not in err, err


def test_an_attack_that_skipped_every_batch_is_named_not_a_blank(tmp_path: Path) -> None:
    """cosine_majority skipped every batch of the Marvell run (its entry: skipped = batches, no
    figure): the table showed '-' with no reason, and the verdict read 'no defense; none on the
    frontier within the budget leaks less', as if Marvell had been measured and leaked more."""
    skipped = {**leak_entry("cosine_majority", 0.5, 0.5), "skipped": 10, "degenerate": 10,
               "flipped": {"mean": None, "p95": None, "max": None},
               "raw": {"mean": None, "p95": None, "max": None}, "threshold_accuracy": {"mean": None}}
    none = fake_run(tmp_path / "runs" / "none", small_config(tmp_path), 0.95,
                    [leak_entry("norm", 0.9, 0.95), leak_entry("cosine_majority", 0.9, 0.95)])
    marvell = fake_run(tmp_path / "runs" / "marvell", small_config(tmp_path, defense=MARVELL),
                       0.945, [leak_entry("norm", 0.6, 0.65), skipped])
    comparison, printed, report = _compare(tmp_path, none, marvell)
    why = "every one of its 10 batch(es) was skipped, 10 of them degenerate: no figure"
    verdict = {v.attack: v.sentence() for v in comparison.verdicts()}
    assert why in verdict["cosine_majority"] and "leaks less" not in verdict["cosine_majority"]
    assert f"cosine_majority: not scored for marvell s=4, its premise fails in its runs: {why}" \
        in printed and why in report
    assert [r["setting"] for r in comparison.rows if r["attack"] == "cosine_majority"] == ["no defense"]
    # the terminal's cell says so, never a bare '-' that reads like a figure left out
    assert "marvell s=4 0.9450 0.739 0.650* skipped" in printed, printed
    assert "skipped = not scored in the setting's runs (why: the warnings below)" in printed


def test_the_terminals_c_dcs_is_report_mds(tmp_path: Path) -> None:
    """With model completion (VFLAIR's PMC, bottom layer) beside norm (cut), the terminal's
    C-DCS was norm's alone (0.676 on the breast cancer sweep) while report.md's Defense
    capability gave the C-DCS over both (0.650) under the same name; table.parquet's c_dcs
    columns were the terminal's."""
    from tests.test_compare import declared

    def completion(accuracy: float) -> dict[str, Any]:
        return {"scope": "run", "party_id": 1, "parties": [1], "layer": "bottom",
                "attack": "model_completion", "metric": "accuracy", "side_knowledge": "own bottom",
                "batches": 1, "skipped": 0, **declared("model_completion"),
                "accuracy": {"mean": accuracy, "p95": accuracy, "max": accuracy},
                "pooled": {"accuracy": accuracy}, "ap": {"metric": "accuracy", "value": accuracy}}

    none, marvell = _runs(tmp_path)
    for run, accuracy in ((none, 0.9), (marvell, 0.7)):
        path = RunDir(run).leak_summary
        summary = json.loads(path.read_text())
        summary["leak"].append(completion(accuracy))
        path.write_text(json.dumps(summary))
    comparison, printed, _ = _compare(tmp_path, none, marvell)
    for setting in ("no defense", "marvell s=4"):
        both = next(r["c_dcs_mean"] for r in comparison.capability
                    if r["setting"] == setting and r["in_t_dcs"])
        norm = next(r for r in comparison.rows if r["setting"] == setting)
        assert f"{both:.3f}" != f"{norm['dcs_mean']:.3f}"  # norm's alone differs here
        assert f"{setting} " in printed and f" {both:.3f} " in printed.split(setting, 1)[1][:40]
        assert norm["c_dcs_mean"] == both  # table.parquet's as well


def test_a_diagnostic_layers_rows_carry_the_capability_c_dcs(tmp_path: Path) -> None:
    """--layer first: table.parquet's row had the C-DCS over the first layer's attacks alone
    (0.702) while the terminal and report.md gave it over the capability layers (0.739), under a
    caption saying "over every layer measured"."""
    none, marvell = _runs(tmp_path)
    for run, (mean, p95) in ((none, (0.9, 0.95)), (marvell, (0.7, 0.75))):
        path = RunDir(run).leak_summary
        summary = json.loads(path.read_text())
        summary["leak"].append(leak_entry("norm", mean, p95, layer="first"))
        path.write_text(json.dumps(summary))
    comparison, printed, _ = _compare(tmp_path, none, marvell, layer="first")
    for setting in ("no defense", "marvell s=4"):
        capability = next(r for r in comparison.capability
                          if r["setting"] == setting and r["in_t_dcs"])
        row = next(r for r in comparison.rows if r["setting"] == setting)
        assert row["layer"] == "first" and row["c_dcs_mean"] == capability["c_dcs_mean"]
        assert row["t_dcs_mean"] == capability["t_dcs_mean"]
    assert "every layer measured of cut, bottom, input, output" in " ".join(printed.split())


def test_a_colluding_groups_entry_is_not_read_as_its_first_partys(tmp_path: Path) -> None:
    """With [threat] collusion = [[1, 2]] the group's entry (party_id 1, parties [1, 2]) came
    after party 1's own, and compare's 'leak at party 1' was the group's p95 (0.641, party 1's
    being 0.660)."""
    own = {**leak_entry("norm", 0.56, 0.66), "parties": [1]}
    group = {**leak_entry("norm", 0.54, 0.64), "parties": [1, 2]}
    run = fake_run(tmp_path / "runs" / "marvell", small_config(tmp_path, defense=MARVELL), 0.94,
                   [own, group])
    comparison, _, report = _compare(tmp_path, run)
    assert comparison.party == 1
    assert [r["leak_mean"] for r in comparison.rows] == [0.66]
    assert "| 0.660 |" in report and "0.640" not in report


def test_the_speed_sections_blank_kib_is_explained(tmp_path: Path) -> None:
    """Runs trained in-process record no bytes: the Speed table's 'KiB / step' read '–' under a
    caption that only spoke of the protobuf messages sent, as if a figure were missing."""
    none, marvell = _runs(tmp_path)
    _, _, report = _compare(tmp_path, none, marvell)
    speed = report.split("## Speed", 1)[1].split("##", 1)[0]
    assert "| float32 | " in speed and " | – | " in speed
    assert "– where the runs record no bytes: a run trained in-process" in speed


def test_the_network_of_an_in_process_run_is_in_process(tmp_path: Path) -> None:
    """A run trained in-process (summary.json's mode) uses no network: the speed tables said
    LAN for it; they now say in-process, and LAN still for a distributed run."""
    none, marvell = _runs(tmp_path, wire={"dtype": "float16"})  # two wires: the speed table too
    for run, mode in ((none, "in-process"), (marvell, "distributed")):
        RunDir(run).summary.write_text(json.dumps({"run_id": run.name, "mode": mode,
                                                   "seconds": 1.0, "train_steps": 1}))
    _, printed, report = _compare(tmp_path, none, marvell)
    speed = report.split("## Speed", 1)[1].split("##", 1)[0]
    assert "| in-process | float16 |" in speed and "| LAN | float32 |" in speed, speed
    assert "in-process" in printed.split("speed (mean over seeds)", 1)[1], printed


@pytest.mark.parametrize("spread", ["x", {"flipped": {"p95": {"std": "0.01"}}}, {"flipped": [0.1]}])
def test_a_spread_edited_into_text_is_refused_naming_where(tmp_path: Path, spread: object) -> None:
    """The spread across draws read "x" (or a statistic's std as "0.01") as no spread at all."""
    from splitleak.api import open_run
    from splitleak.artifacts.summary import SummaryError

    edited = leak_entry("norm", 0.60, 0.65)
    edited["spread"] = spread
    _, marvell = _runs(tmp_path, [edited])
    with pytest.raises(SummaryError) as refused:
        _ = open_run(marvell).summary
    said = " ".join(str(refused.value).split())
    assert "leak entry norm (party 1, cut layer, run): spread" in said and "not a number" in said


def test_a_spread_of_numbers_and_nulls_reads_as_written(tmp_path: Path) -> None:
    from splitleak.api import open_run

    entry = leak_entry("norm", 0.60, 0.65)
    entry["spread"] = {"flipped": {"p95": {"std": 0.01, "min": 0.6, "max": None}}, "raw": None}
    _, marvell = _runs(tmp_path, [entry])
    assert open_run(marvell).summary.leak[0].model_extra["spread"] == entry["spread"]


def test_set_ups_of_one_name_are_told_apart_by_what_differs_in_their_configs(tmp_path: Path) -> None:
    """A run with a malicious passive party next to an honest one read "no defense [3f9a1c]"
    and "no defense [b27e04]": nothing said which was which."""
    none, _ = _runs(tmp_path)
    sgd = {"1": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}
    config = small_config(tmp_path, threat={"parties": {"1": {"optimizer": "malicious"}}},
                          training={"optimizers": sgd})
    malicious = fake_run(tmp_path / "runs" / "malicious", config, 0.96, [leak_entry("norm", 0.9, 0.97)])
    runs, _ = find_runs([none, malicious])
    comparison = compare(runs)
    keys = [s.key[:6] for s in comparison.settings]
    assert sorted(s.label for s in comparison.settings) == sorted(f"no defense [{k}]" for k in keys)
    told = [w for w in comparison.warnings if w.startswith("2 settings are named 'no defense'")]
    assert len(told) == 1, comparison.warnings
    honest, bad = (next(s.key[:6] for s in comparison.settings if s.first.root == root)
                   for root in (none, malicious))
    assert told[0].endswith(
        f"[{honest}] threat.parties.1.optimizer = honest, training.optimizers.1.name = unset, …; "
        f"[{bad}] threat.parties.1.optimizer = malicious, training.optimizers.1.name = sgd, …"), told[0]


def test_three_set_ups_of_one_name_are_told_apart_by_as_many_paths_as_it_takes(
        tmp_path: Path) -> None:
    """(batch_size, epochs, eval_interval) = (32, 1, 1), (32, 1, 2), (64, 2, 1): the first two
    paths that differ told the first two apart from nothing, and the warning said their configs
    were the same."""
    from orchestration.compare.identity import telling_apart
    from splitleak.config import parse_config

    configs = [parse_config(small_config(tmp_path, training={
        "batch_size": b, "epochs": e, "eval_interval": i})) for b, e, i in [(32, 1, 1), (32, 1, 2),
                                                                             (64, 2, 1)]]
    told = telling_apart(configs)
    assert told is not None and len(set(told)) == 3, told
    assert told[1] == "training.batch_size = 32, training.epochs = 1, training.eval_interval = 2"
    assert telling_apart([configs[0], configs[0]]) is None
