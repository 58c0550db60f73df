"""A run analysed again with other options: its summary records them, `attacker analyze` says
its results were replaced, and `splitleak compare` warns and names the settings an attack lacks."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

from attacker.cli import main as attacker_main
from orchestration.compare.read import find_runs
from orchestration.compare.table import compare
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.summary import read_leak_summary


def analyse(*args: str) -> tuple[int, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = attacker_main(["analyze", *args])
    return code, " ".join(printed.getvalue().split())


def test_a_run_analysed_with_other_attacks_is_named_in_the_comparison(
        inprocess_sweep: tuple[Path, str], tmp_path: Path) -> None:
    sweep_dir, _ = inprocess_sweep
    runs, _ = find_runs([sweep_dir])
    copies = {run.label: tmp_path / run.root.name for run in runs}
    for run in runs:
        shutil.copytree(run.root, copies[run.label])
    marvell = copies["marvell, defense.0.s=4.0"]

    code, out = analyse(str(marvell), "--attacks", "clustering:scope=epoch")
    assert code == 0, out
    summary = read_leak_summary(RunDir(marvell))
    assert summary.analysed_with == {"attacks": ["clustering(scope=epoch)"]}
    assert {e.attack for e in summary.leak} == {"clustering(scope=epoch)"}
    assert "these results, analysed with attacks clustering(scope=epoch), replace the run's own" in out

    found, _ = find_runs(list(copies.values()))
    comparison = compare(found)
    assert any(w.startswith(f"{marvell.name}: re-analysed with attacks clustering(scope=epoch)")
               for w in comparison.warnings), comparison.warnings
    (norm,) = [v for v in comparison.verdicts() if v.attack == "norm"]
    assert norm.unmeasured == ("marvell s=4",)  # outside its sweep: named by its config
    assert "(not measured for marvell s=4: their summaries lack this attack)" in norm.sentence()

    # analysed as its config says again ([attacker] attacks = ["norm"], not every default)
    code, out = analyse(str(marvell))
    assert code == 0 and "replace the run's own" not in out
    again = read_leak_summary(RunDir(marvell))
    assert again.analysed_with is None and {e.attack for e in again.leak} == {"norm"}
    assert again.model_dump_json() == read_leak_summary(
        RunDir(next(r.root for r in runs if r.root.name == marvell.name))).model_dump_json()
    found, _ = find_runs(list(copies.values()))
    comparison = compare(found)
    assert not [w for w in comparison.warnings if "re-analysed" in w]
    assert all(not v.unmeasured for v in comparison.verdicts())


def test_the_summary_marks_attacks_outside_marvells_bound(
        inprocess_sweep: tuple[Path, str], tmp_path: Path) -> None:
    """A Marvell run analysed with both oracle-center variants: the one whose centers hold the
    scored row is marked and kept out of the above-bound check; leave-one-out is compared."""
    sweep_dir, _ = inprocess_sweep
    (run,) = [r for r in find_runs([sweep_dir])[0] if r.label == "marvell, defense.0.s=4.0"]
    copy = tmp_path / run.root.name
    shutil.copytree(run.root, copy)
    code, out = analyse(str(copy), "--attacks", "mean:centers=oracle", "mean:centers=oracle_loo")
    assert code == 0, out
    summary = read_leak_summary(RunDir(copy))
    marked = {e.attack: e.sees_scored_label for e in summary.leak if e.scope == "run"}
    assert marked == {"mean(centers=oracle)": True, "mean(centers=oracle_loo)": False}
    assert all(a["attack"] != "mean(centers=oracle)" for a in summary.above_bound)
    report = (RunDir(copy).report / "report.md").read_text()
    assert "Not compared: mean(centers=oracle), whose score of a row reads that row's own label" in report


def test_a_recording_gap_the_run_went_on_with_is_warned_of(
        inprocess_sweep: tuple[Path, str], tmp_path: Path) -> None:
    """attacker.on_sidecar_failure = "continue": the sidecar died at step 607 and the run went
    on; the analysis of what was recorded says its figures cover only part of the run."""
    import json

    sweep_dir, _ = inprocess_sweep
    run = find_runs([sweep_dir])[0][0]
    copy = tmp_path / run.root.name
    shutil.copytree(run.root, copy)
    tap = RunDir(copy).tap(1)
    tap.parent.mkdir(exist_ok=True)
    tap.write_text(json.dumps({"sent": 2400, "acknowledged": 607, "gap_records": 1793,
                               "gap_first_step": 607, "error": "attacker sidecar stopped answering"}))
    code, out = analyse(str(copy))
    assert code == 0, out
    warning = ("party 1: the sidecar did not record 1793 of its gradient records, from step 607 "
               "on (attacker sidecar stopped answering)")
    assert any(w.startswith(warning) for w in read_leak_summary(RunDir(copy)).warnings)
    assert warning in out


def test_named_hint_attacks_take_the_hint_counts(inprocess_sweep: tuple[Path, str],
                                                 tmp_path: Path) -> None:
    """`--attacks hint_inner --hints 3,5` ran k = 1 only while the note said "hints 3, 5" (and a
    config's `attacks = ["hint_inner"]` ignored its threat model's hints): a named hint attack
    that gives no k now runs once per hint count, as the default set does; one that names its k
    keeps it."""
    from attacker.analysis.analyze import with_hints

    sweep_dir, _ = inprocess_sweep
    runs, _ = find_runs([sweep_dir])
    copy = tmp_path / runs[0].root.name
    shutil.copytree(runs[0].root, copy)
    code, out = analyse(str(copy), "--attacks", "hint_inner", "--hints", "3,5")
    assert code == 0, out
    assert {e.attack for e in read_leak_summary(RunDir(copy)).leak} == {
        "hint_inner(k=3)", "hint_inner(k=5)"}
    assert with_hints([("hint_distance", {"k": 2}), ("norm", {}), ("hint_inner", {})], [1, 4]) == [
        ("hint_distance", {"k": 2}), ("norm", {}), ("hint_inner", {"k": 1}), ("hint_inner", {"k": 4})]
