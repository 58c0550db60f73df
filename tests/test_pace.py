"""Time per step and time to a utility, read from metrics.jsonl records."""

from __future__ import annotations

import pytest

from attacker.report.report import _pace_md
from splitleak.artifacts.metrics_log import MetricsLog
from splitleak.pace import StepClock, time_to, utility_curve

RECORDS = [
    {"type": "plan"},
    {"type": "train", "step": 0, "wall": 0.10},
    {"type": "train", "step": 1, "wall": 0.30},
    {"type": "eval", "step": 2, "wall": 1.30, "test_auc": 0.61},
    {"type": "train", "step": 2, "wall": 1.50},  # the evaluation pass is not a step's time
    {"type": "train", "step": 3, "wall": 1.80},
    {"type": "train", "step": 4, "wall": 0.05},  # resumed: the clock restarted
    {"type": "train", "step": 5, "wall": 0.45},
    {"type": "eval", "step": 6, "wall": 0.90, "test_auc": 0.70},
]


def test_step_times_skip_evaluations_and_restarts() -> None:
    clock = StepClock()
    for record in RECORDS:
        clock.add(record)
    assert clock.seconds.tolist() == pytest.approx([0.2, 0.3, 0.4])
    assert MetricsLog.of(RECORDS).ms_per_step == pytest.approx(300.0)
    assert MetricsLog.of([{"type": "train", "step": 0, "wall": 1.0}]).ms_per_step is None


def test_the_pace_of_a_resumed_run_covers_the_whole_run() -> None:
    """After `splitleak run --resume`, report.md said "training took 1.8 s": the part before the
    kill alone (or the resumed part alone, had it been longer), the clock having started again
    at the resume; it now sums both parts (1.8 + 0.9 s) and says the run was resumed."""
    metrics = MetricsLog.of(RECORDS)
    assert metrics.trained_seconds == pytest.approx(2.7) and metrics.resumes == 1
    (line, _) = _pace_md(metrics)
    assert line.startswith("Pace: median train step 300.0 ms; training took 2.7 s (label "
                           "party's clock, evaluation passes included; resumed 1 time(s): the "
                           "whole run, each part's time summed"), line
    whole = MetricsLog.of(RECORDS[:6])  # before the kill: as it was
    assert whole.trained_seconds == 1.80 and whole.resumes == 0
    assert _pace_md(whole)[0] == ("Pace: median train step 250.0 ms; training took 1.8 s (label "
                                  "party's clock, evaluation passes included; `splitleak compare` "
                                  "gives the time to a target utility).")


def test_time_to_target_is_the_first_evaluation_reaching_it() -> None:
    """The time to a target counts on across a resume: the evaluation 0.9 s after it read 0.9 s
    (splitleak compare's seconds_to_target, its run faster than one never killed); 2.7 s now."""
    curve = utility_curve(RECORDS, "test_auc")
    assert curve == [(1.30, 0.61), (pytest.approx(2.70), 0.70)]
    assert MetricsLog.of(RECORDS).utility_curve("test_auc") == curve
    assert time_to(curve, 0.6) == 1.30
    assert time_to(curve, 0.65) == pytest.approx(2.70)
    assert time_to(curve, 0.75) is None
    assert utility_curve(RECORDS, "test_accuracy") == []
