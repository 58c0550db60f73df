"""metrics.jsonl is read once into a MetricsLog (per-step arrays, the few other records as dicts):
each reader gets from it what it computed from the whole list of records, value for value."""

from __future__ import annotations

import json
import tracemalloc
from collections import defaultdict
from pathlib import Path
from statistics import median
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from attacker.analysis.inputs import AnalysisInputError, partial_run, read_records
from attacker.analysis.staging import Outputs
from attacker.analysis.summary import marvell_bounds
from attacker.attacks.integrity.base import variant_passes
from attacker.report import report
from orchestration.compare import read as compare_read
from splitleak.artifacts.metrics import MetricsError, read_metrics
from splitleak.artifacts.metrics_log import MetricsLog, StepBounds, read_metrics_log
from splitleak.artifacts.paths import RunDir
from splitleak.pace import utility_curve


def _records(steps: int, defense: bool = True) -> list[dict[str, Any]]:
    """A plan, train records (some with Marvell's and a second defense's bounds, one without a
    loss, one with a null loss, a repeated step), evaluations (one without its AUC, some
    scoring an integrity variant)."""
    rng = np.random.default_rng(7)
    records: list[dict[str, Any]] = [{"type": "plan", "total_train_steps": steps + 10, "num_classes": 2}]
    wall = 0.0
    for step in range(steps):
        wall += float(rng.random()) / 10
        record: dict[str, Any] = {"type": "train", "epoch": step // 50, "step": step,
                                  "loss": float(rng.random()), "batch_size": 32, "positives": 7,
                                  "wall": wall, "cross_entropy": 0.3}
        if defense and step % 4:
            record["defense.1"] = {"marvell.auc_bound": float(0.5 + rng.random() / 2),
                                   "marvell.sumkl_after": 0.2,
                                   **({"other.auc_bound": 0.6} if step % 5 == 0 else {}),
                                   **({"late.auc_bound": None} if step % 7 == 0 else {})}
        if defense and step % 3 == 0:
            record["defense.2"] = {"marvell.auc_bound": 0.9, "marvell.sumkl_after": 0.1}
        records.append(record)
        if step % 25 == 24:
            wall += 2.0
            scored = {"test_auc": 0.6 + step / 1e4, "test_accuracy": 0.8} if step != 49 else {}
            records.append({"type": "eval", "epoch": step // 50, "step": step + 1, "wall": wall,
                            "test_loss": 0.4, "test_rows": 60 if step < 70 else 12, **scored,
                            **({"noisy_accuracy": 0.5, "noisy_clean_accuracy": 0.7,
                                "noisy_confusion": [[3, 1], [2, 4]]} if step > 50 else {})})
    if steps > 12:
        del records[11]["loss"]
        records[12]["loss"] = None
        records.append({**records[7], "wall": wall + 0.1,  # step 6 again: a dict kept this bound
                        **({"defense.1": {"marvell.auc_bound": 0.55}} if defense else {})})
    return records


def _write(path: Path, records: list[dict[str, Any]], torn: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    path.write_text(text + ('{"type":"train","step":99,"lo' if torn else ""))
    return path


# What each reader computed from the list of records before (the reference)

def old_marvell_bounds(records: list[dict[str, Any]]) -> dict[int, dict[int, float]]:
    found: dict[int, dict[int, float]] = defaultdict(dict)
    for r in (r for r in records if r.get("type") == "train"):
        for key, diagnostics in r.items():
            if key.startswith("defense.") and isinstance(diagnostics, dict):
                values = [v for k, v in diagnostics.items() if k.endswith("auc_bound") and v is not None]
                if values:
                    found[int(key.removeprefix("defense."))][int(r["step"])] = min(values)
    return dict(found)


def old_training_arrays(records: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    train = [r for r in records if r.get("type") == "train"]
    return (np.array([r["step"] for r in train]),
            np.array([np.nan if r.get("loss") is None else r["loss"] for r in train], dtype=float))


def old_utility(records: list[dict[str, Any]]) -> dict[str, Any]:
    evals = [r for r in records if r.get("type") == "eval"]
    out: dict[str, Any] = {}
    names = {"test_auc": "test AUC", "test_accuracy": "test accuracy", "test_loss": "test loss"}
    for key, name in names.items():
        if evals and evals[-1].get(key) is not None:
            out[name] = float(evals[-1][key])
    out["train steps"] = sum(1 for r in records if r.get("type") == "train")
    return out


def old_pace(records: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    seconds, previous = [], None  # pace.step_seconds as it was
    for record in records:
        kind, wall = record.get("type"), record.get("wall")
        if kind == "eval":
            previous = None
        elif kind == "train" and isinstance(wall, int | float):
            if previous is not None and wall > previous:
                seconds.append(wall - previous)
            previous = wall
    walls = [r["wall"] for r in records if r.get("type") in ("train", "eval")
             and isinstance(r.get("wall"), int | float)]
    return (1000 * median(seconds) if seconds else None), (max(walls) if walls else None)


@pytest.fixture(params=[True, False], ids=["defense", "no-defense"])
def logged(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[RunDir, list[dict[str, Any]]]:
    run = RunDir(tmp_path / "run")
    path = _write(run.metrics, _records(120, defense=request.param))
    return run, list(read_metrics(path))


def test_the_arrays_are_the_records_figures(logged: tuple[RunDir, list[dict[str, Any]]]) -> None:
    run, records = logged
    metrics = read_metrics_log(run.metrics)
    steps, loss = old_training_arrays(records)
    assert metrics.steps.dtype == steps.dtype and np.array_equal(metrics.steps, steps)
    assert metrics.loss.dtype == loss.dtype and np.array_equal(metrics.loss, loss, equal_nan=True)
    assert np.isnan(metrics.loss[[10, 11]]).all() and metrics.train_steps == 121
    assert metrics.others == [r for r in records if r.get("type") != "train"]
    assert metrics.plan == records[0] and metrics.evals == [r for r in records if r.get("type") == "eval"]
    assert metrics.ms_per_step == old_pace(records)[0] and metrics.trained_seconds == old_pace(records)[1]
    assert utility_curve(metrics.evals, "test_auc") == utility_curve(records, "test_auc")


def test_the_bounds_are_the_records_bounds(logged: tuple[RunDir, list[dict[str, Any]]]) -> None:
    run, records = logged
    old, new = old_marvell_bounds(records), marvell_bounds(read_records(run))
    assert new == old and list(new) == list(old)
    for party, points in old.items():
        assert list(new[party]) == list(points)  # the steps in the order they first appear
        assert list(new[party].values()) == list(points.values())
        assert all(type(new[party][step]) is float for step in points)
        assert np.array_equal(new[party].steps, np.array(list(points)))
        assert np.array_equal(new[party].bounds, np.array(list(points.values())))
    if old:
        assert old[1][6] == 0.55 == new[1][6] and list(new[1]).index(6) == 4
        assert new[1][5] == min(records[6]["defense.1"]["marvell.auc_bound"], 0.6)  # the chain's lowest
        assert 0 not in new[1] and 0 in new[2] and new[1].get(0) is None


def test_the_reports_figures_are_the_records(logged: tuple[RunDir, list[dict[str, Any]]]) -> None:
    run, records = logged
    metrics = report._Inputs.read(run).metrics
    assert report._utility(metrics) == old_utility(records) and report.utility(run) == old_utility(records)
    (warning,) = report.few_test_rows(metrics)  # the final evaluation's rows
    assert warning.startswith("the utility figures come from 12 test row(s)")
    assert report.few_test_rows(MetricsLog.of(records[:30])) == []
    step, wall = old_pace(records)
    assert report._pace_md(metrics)[0] == f"Pace: median train step {step:.1f} ms; training took " \
        f"{wall:.1f} s (label party's clock, evaluation passes included; `splitleak compare` " \
        "gives the time to a target utility)."
    old = {party: (np.array(list(p)), np.array(list(p.values())))
           for party, p in old_marvell_bounds(records).items()}
    new = report._bounds(metrics)
    assert list(new) == list(old)
    for party, (steps, values) in old.items():
        assert new[party][0].dtype == steps.dtype and np.array_equal(new[party][0], steps)
        assert new[party][1].dtype == values.dtype and np.array_equal(new[party][1], values)


def test_the_training_plot_draws_the_records_arrays(logged: tuple[RunDir, list[dict[str, Any]]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from attacker.report import plots

    run, records = logged
    drawn: list[tuple[Any, ...]] = []
    monkeypatch.setattr(plots, "training_curves", lambda *args, path: drawn.append(args))
    with Outputs(run) as out:
        report._draw_plots(run, out, {"leak": []}, report._Inputs.read(run), [], [])
    (steps, loss, evals), = drawn
    old_steps, old_loss = old_training_arrays(records)
    assert np.array_equal(steps, old_steps) and np.array_equal(loss, old_loss, equal_nan=True)
    assert evals == [r for r in records if r.get("type") == "eval"
                     and (r.get("test_auc") is not None or r.get("test_accuracy") is not None)]
    assert len(evals) == 3  # the evaluation that scored nothing is not drawn


def test_a_partial_runs_progress_is_the_records(logged: tuple[RunDir, list[dict[str, Any]]]) -> None:
    run, records = logged
    done = partial_run(run, read_records(run))
    assert done is not None and done["train_steps_done"] == sum(r["type"] == "train" for r in records)
    assert done["train_steps_planned"] == 130
    run.outcome.write_text(json.dumps({"status": "ok"}))
    assert partial_run(run, read_records(run)) is None


def test_compare_reads_what_the_records_gave(logged: tuple[RunDir, list[dict[str, Any]]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    run, records = logged
    run.config.write_text("")
    run.report.mkdir()
    (run.report / "summary.json").write_text(json.dumps({"num_classes": None, "leak": []}))
    run.outcome.write_text(json.dumps({"status": "ok", "bytes_sent": 4096, "bytes_received": 6144}))
    monkeypatch.setattr(compare_read, "load_config", lambda path: None)
    found = compare_read.read_run(run.root)
    evals = [r for r in records if r.get("type") == "eval"]
    trains = sum(r["type"] == "train" for r in records)
    assert (found.final_eval, found.num_classes) == (evals[-1], 2)
    assert found.ms_per_step == old_pace(records)[0]
    assert found.curve == tuple(utility_curve(records, "test_auc"))
    assert found.bytes_per_step == (4096 + 6144) / trains


def test_the_integrity_passes_are_the_evaluations(logged: tuple[RunDir, list[dict[str, Any]]]) -> None:
    run, records = logged
    threat = SimpleNamespace(party=lambda k: SimpleNamespace(integrity={"noisy"}))
    context = SimpleNamespace(parties=(1,), cfg=SimpleNamespace(threat=threat), run=run)
    passes = variant_passes(context, "noisy", "noisy_samples")  # type: ignore[arg-type]
    old = [r for r in records if r.get("type") == "eval" and "noisy_confusion" in r]
    assert old and [(p.step, p.test_accuracy, p.test_rows, p.accuracy, p.clean_accuracy,
                     p.confusion.tolist()) for p in passes] == [
        (r["step"], r["test_accuracy"], r["test_rows"], r["noisy_accuracy"], r["noisy_clean_accuracy"],
         r["noisy_confusion"]) for r in old]


def test_a_bad_line_is_refused_as_read_metrics_refuses_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "metrics.jsonl", _records(20), torn=False)
    with path.open("a") as f:
        f.write('{"type": "train", "step": "x"}\n')
    with pytest.raises(MetricsError) as refused:
        list(read_metrics(path))
    with pytest.raises(MetricsError) as again:
        read_metrics_log(path)
    assert str(again.value) == str(refused.value) and f"{path} line 23" in str(again.value)
    assert read_metrics_log(tmp_path / "absent.jsonl").empty


@pytest.mark.parametrize(("record", "words"), [
    ({"type": "train", "loss": 0.3}, "a train record's \"step\" is its integer number, got None"),
    ({"type": "train", "step": 2.0}, "got 2.0"),
    ({"type": "train", "step": 2, "defense.one": {"marvell.auc_bound": 0.7}},
     "'defense.one' must name a party"),
    ({"type": "train", "step": 2, "defense.1": {"marvell.auc_bound": "high"}}, "must be numbers or null")])
def test_a_train_record_the_arrays_cannot_hold_is_refused_naming_the_line(
        tmp_path: Path, record: dict[str, Any], words: str) -> None:
    """The list-of-records readers failed on these later, with a traceback (int(None) of the
    bound's step) or a failed plot (KeyError: 'step')."""
    run = RunDir(tmp_path / "run")
    _write(run.metrics, [*_records(3), record], torn=False)
    with pytest.raises(AnalysisInputError, match=f"{run.metrics} line 5: .*{words}".replace("(", r"\(")):
        read_records(run)


def test_step_bounds_read_like_a_dict() -> None:
    bounds = StepBounds(np.array([5, 2, 9]), np.array([0.7, 0.8, 0.9]))
    assert bounds == {5: 0.7, 2: 0.8, 9: 0.9} and list(bounds) == [5, 2, 9] and len(bounds) == 3
    assert bounds[np.int64(9)] == 0.9 and 3 not in bounds and 10 not in bounds and bounds.get(1) is None
    with pytest.raises(KeyError):
        bounds[-1]


STEPS = 20_000


def test_the_readers_hold_arrays_not_the_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The list of records of 20,000 steps with Marvell's diagnostics takes ~30 MB of traced
    memory; each reader's peak is the arrays', a few hundred KB, and a line being parsed."""
    run = RunDir(tmp_path / "run")
    _write(run.metrics, _records(STEPS))
    run.config.write_text("")
    run.report.mkdir()
    (run.report / "summary.json").write_text(json.dumps({"num_classes": 2, "leak": []}))
    monkeypatch.setattr(compare_read, "load_config", lambda path: None)
    readers = {"analysis": lambda: read_records(run), "report": lambda: report._Inputs.read(run),
               "compare": lambda: compare_read.read_run(run.root),
               "records": lambda: list(read_metrics(run.metrics))}
    peaks = {}
    for name, read in readers.items():
        read()  # imports and caches first
        tracemalloc.start()
        try:
            held = read()
            peaks[name] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        del held
    assert peaks["records"] > 20e6, peaks  # the reference: what each reader held before
    for name in ("analysis", "report", "compare"):
        assert peaks[name] < 5e6, peaks  # measured 3.2 MB: the arrays and 800 evaluations (1.2 MB)
