"""`splitleak bench`: interleaved rounds, their statistics, the JSON layout, the step budget, CLI."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from attacker.bench import bench_mode
from attacker.bench.completion import completion_figures
from attacker.bench.exact import batch_rows
from attacker.cli import main as attacker_main
from orchestration import bench_rounds, soak, zygote_client
from orchestration.bench import (
    bench_config,
    bench_header,
    bench_variants,
    per_train_step,
    raw_tensor_bytes,
    steady_steps_per_second,
    step_message_bytes,
)
from orchestration.bench_budget import COMPONENTS, LEGEND, median_budget, step_budget
from orchestration.bench_floor import round_trip_ms
from orchestration.bench_report import (
    GRAPHED,
    GRAPHED_IN_PROCESS,
    PLAINTEXT,
    critical_ratio,
    print_bench,
    ratio_pairs,
    summarise_rounds,
)
from orchestration.bench_rounds import (
    busy_rounds,
    cpu_clock,
    describe,
    interleave,
    other_cores,
    per_round_ratios,
    spread,
)
from orchestration.cli import main
from orchestration.reference import run_reference
from splitleak.artifacts.outcome import write_outcome
from splitleak.artifacts.paths import TIMING_FILE, RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.artifacts.timing import read_cpu, read_timing
from splitleak.config import parse_config
from splitleak.datasets.split import train_test_ids
from splitleak.timing import WARMUP_STEPS, CpuWindow, StepTimer, timed, write_cpu
from tests.conftest import scaled, small_config


def test_spread_median_min_max_and_a_bootstrap_interval_inside_the_range():
    s = spread([0.9, 1.1, 0.8, 1.0, 0.95])
    assert s["median"] == 0.95 and s["min"] == 0.8 and s["max"] == 1.1 and s["n"] == 5
    low, high = s["ci95"]
    assert 0.8 <= low <= 0.95 <= high <= 1.1
    assert spread([0.9, 1.1, 0.8, 1.0, 0.95])["ci95"] == s["ci95"]  # reproducible
    assert s["values"] == [0.9, 1.1, 0.8, 1.0, 0.95]  # every round kept, in order
    many = spread([1.0 + 0.01 * i for i in range(12)])
    assert many["min"] < many["ci95"][0] and many["ci95"][1] < many["max"]  # narrower than range
    assert "95 % CI" in describe(many) and "95 % CI" not in describe(s)


def test_spread_has_no_interval_for_one_round_or_identical_rounds():
    assert spread([1.2])["ci95"] is None and spread([1.2])["median"] == 1.2
    assert spread([1.0, 1.0, 1.0])["ci95"] is None
    with pytest.raises(ValueError, match="no rounds"):
        spread([])


def test_interleave_alternates_the_order_and_records_load_around_each_round(monkeypatch):
    loads = iter([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    monkeypatch.setattr(bench_rounds, "load_average", lambda: next(loads))
    calls: list[str] = []

    def variant(name: str, value: float):
        def run() -> dict:
            calls.append(name)
            return {"steps_per_s": value}
        return run

    seen: list[int] = []
    rounds = interleave({"A": variant("A", 10.0), "B": variant("B", 5.0)}, 3,
                        lambda r: seen.append(r["round"]))
    assert calls == ["A", "B", "B", "A", "A", "B"]
    assert [r["order"] for r in rounds] == [["A", "B"], ["B", "A"], ["A", "B"]]
    assert [(r["load_start"], r["load_end"]) for r in rounds] == [(0.1, 0.2), (0.3, 0.4), (0.5, 0.6)]
    assert seen == [0, 1, 2]
    assert per_round_ratios(rounds, "B", "A") == [0.5, 0.5, 0.5]
    for r in rounds:  # measured from /proc/stat here: the bench's own work is not "other"
        assert r["other_cores"] is None or 0 <= r["other_cores"] <= (os.cpu_count() or 1)
        r["other_cores"] = None
    assert busy_rounds(rounds, 0.35) == [1, 2]  # unmeasured: the load average decides


def test_other_processes_cpu_is_the_machine_busy_time_minus_our_own():
    assert other_cores((0.0, 10.0, 4.0), (2.0, 13.0, 6.5)) == pytest.approx(0.25)  # (3-2.5)/2
    assert other_cores((0.0, 10.0, 4.0), (2.0, 12.0, 6.5)) == 0.0  # never below zero
    assert other_cores(None, (2.0, 12.0, 6.5)) is None
    assert other_cores((0.0, 10.0, 4.0), (0.001, 10.01, 4.0)) is None  # one tick in 1 ms: unmeasured
    rounds = [{"round": 0, "load_start": 9.0, "load_end": 9.0, "other_cores": 0.1},
              {"round": 1, "load_start": 0.1, "load_end": 0.1, "other_cores": 0.6}]
    assert busy_rounds(rounds, None) == [1]  # measured: other processes' share decides
    assert busy_rounds(rounds, 1.0) == [0, 1]  # --busy-load given: its load threshold too
    assert busy_rounds(rounds, 100.0) == [1]
    unmeasured = [r | {"other_cores": None} for r in rounds]
    assert busy_rounds(unmeasured, None) == ([0] if 9.0 > bench_rounds.default_busy_load() else [])
    clock = cpu_clock()
    assert clock is None or (clock[1] >= 0 and clock[2] > 0)


def _budget(step: float) -> dict[str, float]:
    return {key: step if key == "step" else 1.0 for key, _ in COMPONENTS}


def _rounds(n: int) -> list[dict]:
    return [{"round": i, "order": [], "load_start": 0.2 * i, "load_end": 0.2 * i + 0.1,
             "variants": {"in-process": {"steps_per_s": 20.0 + i},
                          "in-process 3 threads": {"steps_per_s": 30.0},
                          "distributed": {"steps_per_s": 18.0 + i, "budget": _budget(50.0 + i),
                                          "first_step_s": 1.0 + 0.1 * i},
                          "distributed+sidecar": {"steps_per_s": 16.0,
                                                  "budget": _budget(60.0)},
                          "in-process N=2": {"steps_per_s": 20.0},
                          "in-process N=2, 3 threads": {"steps_per_s": 28.0},
                          "distributed N=2": {"steps_per_s": 21.0, "budget": _budget(40.0)},
                          "in-process N=4": {"steps_per_s": 10.0},
                          "distributed N=4": {"steps_per_s": 12.0, "budget": _budget(70.0)}}}
            for i in range(n)]


def test_summary_json_keeps_every_round_and_names_every_ratio():
    result = json.loads(json.dumps(summarise_rounds(_rounds(5), [2, 4], busy_load=0.5)))
    assert len(result["rounds"]) == 5 and result["rounds"][3]["variants"]["in-process"] == {
        "steps_per_s": 23.0}
    names = list(result["rounds"][0]["variants"])
    assert set(result["ratios"]) == set(ratio_pairs([2, 4], names)) == {
        "distributed / in-process (1 thread)", "distributed / in-process (3 threads)",
        "with sidecar / without", "distributed / in-process (1 thread), N=2",
        "distributed / in-process (3 threads), N=2", "distributed / in-process (1 thread), N=4",
        "distributed N=4 / N=2", "in-process N=4 / N=2"}
    assert result["ratios"]["distributed / in-process (3 threads)"]["median"] == pytest.approx(20 / 30)
    # a step over its critical path (label compute + codec, then the slowest party's): 4 ms
    assert result["step_over_critical_path"]["distributed"]["median"] == pytest.approx(52.0 / 4)
    # ... and over that path plus the gRPC round trip alone (1 ms in every fake budget)
    assert result["step_over_path_and_wire"]["distributed"]["median"] == pytest.approx(52.0 / 5)
    assert result["first_step_s"]["distributed"]["median"] == pytest.approx(1.2)
    assert "distributed N=2" not in result["first_step_s"]  # not measured there
    ratio = result["ratios"]["distributed / in-process (1 thread)"]
    assert ratio["values"] == pytest.approx([18 / 20, 19 / 21, 20 / 22, 21 / 23, 22 / 24])
    assert ratio["median"] == pytest.approx(20 / 22)
    assert result["ratios"]["distributed N=4 / N=2"]["median"] == pytest.approx(12 / 21)
    assert result["steps_per_s"]["distributed"]["min"] == 18.0
    assert result["budget_ms"]["distributed"]["step"] == 52.0  # the median round's
    assert "with TLS / plaintext" not in ratio_pairs([], names)  # only where it was measured
    assert ratio_pairs([], [*names, PLAINTEXT])["with TLS / plaintext"] == ("distributed", PLAINTEXT)
    graphed = ratio_pairs([], [*names, GRAPHED, GRAPHED_IN_PROCESS])
    assert graphed["CUDA graphs / eager, distributed"] == (GRAPHED, "distributed")
    assert graphed["CUDA graphs / eager, in-process (1 thread)"] == (GRAPHED_IN_PROCESS, "in-process")
    assert graphed["distributed / in-process, both CUDA graphs"] == (GRAPHED, GRAPHED_IN_PROCESS)
    assert not any("CUDA graphs" in name for name in ratio_pairs([], names))
    assert set(result["budget_ms"]) == {"distributed", "distributed+sidecar", "distributed N=2",
                                        "distributed N=4"}
    assert result["busy_rounds"] == [3, 4]  # load above 0.5 at its end


def _printable(result: dict) -> dict:
    return result | {"steps": 60, "raw_bytes_per_step": 1.0, "protobuf_bytes_per_step": 1.0,
                     "wire_bytes_per_step": 1.02, "wire_over_raw": 1.02,
                     "marvell_ms": {"1024x128": 1.0}}


def test_the_printout_shows_ratios_with_spread_the_budget_and_warns_when_busy():
    console = Console(record=True, width=200)
    print_bench(_printable(summarise_rounds(_rounds(5), [2, 4], busy_load=0.5)), console)
    text = console.export_text()
    assert "distributed / in-process (1 thread), per round" in text
    assert "distributed / in-process (3 threads), per round" in text
    assert "distributed: step / critical path (aim <= 1.1)" in text
    assert "distributed: time to first train step, s" in text and "1.20 [1.00–1.40]" in text
    assert "0.91 [0.90–0.92] (5 rounds)" in text  # the 95 % CI of 5 rounds is their range
    assert "median [min–max] over rounds" in text
    assert "distributed N=4 / N=2, per round" in text
    assert "party compute" in text and "transport+scheduling" in text
    assert "0.00->0.10, 0.20->0.30" in text
    assert "the machine was busy (1-minute load above 0.5) in round(s) 4, 5" in text
    console = Console(record=True, width=200)
    measured = [r | {"other_cores": 0.5 if r["round"] == 2 else 0.05} for r in _rounds(5)]
    print_bench(_printable(summarise_rounds(measured, [2, 4], busy_load=None)), console)
    text = console.export_text()
    assert "cores used by other processes during each round: 0.05, 0.05, 0.50, 0.05, 0.05" in text
    assert "busy (other processes used more than 0.25 of a core) in round(s) 3:" in text
    console = Console(record=True, width=200)
    print_bench(_printable(summarise_rounds(_rounds(1), [], busy_load=10.0)), console)
    text = console.export_text()
    assert "machine was busy" not in text and "(1 round)" in text


def test_step_timer_sums_spans_per_train_step_past_the_warm_up(tmp_path):
    timer = StepTimer()
    for step in range(WARMUP_STEPS + 3):
        with timer.span("compute", timed(True, step)):
            pass
        with timer.span("compute", timed(False, step)):  # evaluation batches do not count
            pass
    timer.add("wait", 0.006)
    timer.add("wait", 0.002)
    timer.write(tmp_path / TIMING_FILE, per="compute")
    data = json.loads((tmp_path / TIMING_FILE).read_text())
    assert data["train_steps"] == 3 and data["spans"]["compute"]["count"] == 3
    assert read_timing(tmp_path / TIMING_FILE)["wait"] == pytest.approx(8.0 / 3)
    assert read_timing(tmp_path / "missing.json") == {}


def test_the_timer_takes_the_process_cpu_over_the_timed_steps(tmp_path):
    timer = StepTimer()
    with timer.span("compute", timed(True, 0)):  # warm-up: no CPU window yet
        sum(range(200_000))
    assert timer.cpu.first is None
    for step in range(WARMUP_STEPS, WARMUP_STEPS + 4):
        with timer.span("compute", timed(True, step)):
            sum(range(400_000))  # a few ms of user CPU each
    timer.write(tmp_path / TIMING_FILE, per="compute")
    cpu = read_cpu(tmp_path / TIMING_FILE)
    assert cpu["user_ms_per_step"] > 0.5 and cpu["system_ms_per_step"] >= 0.0
    assert cpu["user_ms_per_step"] + cpu["system_ms_per_step"] <= 1.5 * 1e3 * sum(
        read_timing(tmp_path / TIMING_FILE).values()) + 5.0  # one thread: CPU ≈ the span time
    assert read_cpu(tmp_path / "missing.json") == {}
    window = CpuWindow()
    assert window.per_step(10) == {}  # never marked
    write_cpu(tmp_path / "sidecar.json", window, 0)
    assert read_cpu(tmp_path / "sidecar.json") == {}


def _timing(path: Path, steps: int, **ms: float) -> None:
    """A party's timing.json: `steps` train steps, `ms` per step of each span."""
    timer = StepTimer()
    for _ in range(steps):
        timer.add("forward", 0.0)
    for name, value in ms.items():
        timer.add(name, value * steps / 1e3)
    path.mkdir(parents=True, exist_ok=True)
    timer.write(path / TIMING_FILE, per="forward")


def test_step_budget_takes_the_busiest_party_and_leaves_transport_as_the_rest(tmp_path):
    run = RunDir(tmp_path)
    label = StepTimer()
    for _ in range(10):
        label.add("compute", 0.012)
        label.add("exchange", 0.020)
        label.add("encode", 0.0005)
        label.add("decode", 0.0005)
        label.add("update", 0.002)  # inside the exchange, while the parties compute
    run.label_party.mkdir(parents=True)
    label.write(run.label_party / TIMING_FILE, per="compute")
    _timing(run.passive_party(1), 10, backward=6.0, decode=0.2, encode=0.2, tap=2.0, wait=15.0,
            write=3.0)
    _timing(run.passive_party(2), 10, backward=9.0, decode=0.3, encode=0.2, tap=1.0, wait=14.0,
            write=0.5)
    (run.attacker).mkdir(parents=True)
    (run.attacker / TIMING_FILE).write_text(json.dumps(
        {"train_steps": 9, "spans": {}, "cpu": {"user_ms_per_step": 1.0, "system_ms_per_step": 3.0}}))
    budget = step_budget(run, 2, steps_per_s=25.0)
    assert budget["cpu_sidecar"] == pytest.approx(4.0)
    assert budget["cpu_system"] >= 3.0 and budget["cpu_parties"] >= 0.0
    assert budget["step"] == pytest.approx(40.0)
    assert budget["label_compute"] == pytest.approx(12.0)
    assert budget["label_codec"] == pytest.approx(1.0)
    assert budget["label_waiting"] == pytest.approx(17.0)
    assert budget["label_update"] == pytest.approx(2.0)
    assert budget["passive_compute"] == pytest.approx(9.0)  # party 2: busier without `write`
    assert budget["passive_tap"] == pytest.approx(2.0)  # the tapped party's, slowest or not
    assert budget["transport"] == pytest.approx(19.0 - 9.5)  # its tap runs after it answered
    assert budget["passive_waiting"] == pytest.approx(14.0)
    # the path: label compute and codec, then the slower of the party and the label's update
    assert critical_ratio(budget) == pytest.approx(40.0 / (12.0 + 1.0 + 9.5))
    assert critical_ratio({**budget, "label_update": 11.0}) == pytest.approx(40.0 / 24.0)
    (run.label_party / TIMING_FILE).unlink()
    with pytest.raises(ValueError, match="wrote no timing"):
        step_budget(run, 2, steps_per_s=25.0)


def test_the_in_process_reference_times_the_label_party_too(tmp_path):
    cfg = parse_config(small_config(tmp_path))
    run = create_run_dir(cfg, tmp_path / "ref")
    outcome = run_reference(cfg, run)
    timing = json.loads((run.label_party / TIMING_FILE).read_text())
    assert timing["train_steps"] == outcome["train_steps"] - WARMUP_STEPS > 0
    assert set(timing["spans"]) == {"compute", "exchange"}  # no codec in-process


def test_bench_config_scales_parties_at_the_same_cut_width():
    cfg = bench_config(30, parties=4)
    assert cfg.topology.passive_parties == 4 and cfg.features.ratios == [1.0] * 4
    assert cfg.model.layers == bench_config(30).model.layers
    assert cfg.training.max_steps == 30 and not cfg.attacker.enabled
    assert bench_config(30, sidecar=True).attacker.enabled



@pytest.mark.parametrize("steps", [10, 60, 200, 1000])
def test_every_measured_step_is_in_the_first_epoch(steps):
    """No evaluation pass between measured train steps: the default set-up's data grows."""
    cfg = bench_config(steps)
    train, _ = train_test_ids(cfg.dataset.params["rows"], cfg.dataset.test_fraction, cfg.run.seed)
    assert len(train) // cfg.training.batch_size > steps
    assert cfg.dataset.params["rows"] == max(100_000, cfg.dataset.params["rows"])
    assert steps > 60 or cfg.dataset.params["rows"] == 100_000  # the default set-up where it fits


@pytest.mark.parametrize("argv, says", [
    (["--rounds", "0"], "outside 1.."), (["--parties", "0"], "outside 1..64"),
    (["--parties", "65"], "outside 1..64"), (["--steps", "x"], "not an integer"),
    (["--steps", "5"], "outside 10.."), (["--json", "/nonexistent/dir/b.json"], "does not exist"),
    (["--quick", "--rounds", "3"], "--quick is one round; give --quick or --rounds N, not both"),
])
def test_bad_bench_arguments_exit_2_naming_what_is_allowed(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", *argv])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_bench_help_states_the_steps_default_and_minimum(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "at least 10; default 60" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow
def test_quick_bench_runs_one_round_and_writes_its_json(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "orchestration", "bench", "--quick", "--steps",
                           "12", "--plaintext", "--json", str(out)], capture_output=True, text=True,
                          timeout=scaled(600), env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert len(result["rounds"]) == 1
    threads = result["threads"]  # the distributed run's threads in all: 1 a process here
    assert set(result["rounds"][0]["variants"]) == {"in-process", f"in-process {threads} threads",
                                                   "distributed", "distributed+sidecar", PLAINTEXT}
    assert result["ratios"]["with TLS / plaintext"]["median"] > 0
    budget = result["budget_ms"]["distributed"]
    assert budget["label_compute"] > 0 and budget["passive_compute"] > 0
    assert result["ratios"]["distributed / in-process (1 thread)"]["n"] == 1
    assert result["first_step_s"]["distributed"]["median"] > 0
    assert result["step_over_critical_path"]["distributed"]["median"] > 1
    # the path plus the wire's floor (an echo over TLS; plaintext for the plaintext run)
    assert 0 < budget["wire_floor"] < budget["step"]
    assert result["budget_ms"][PLAINTEXT]["wire_floor"] > 0
    assert (result["step_over_path_and_wire"]["distributed"]["median"]
            < result["step_over_critical_path"]["distributed"]["median"])
    assert "distributed / in-process (1 thread), per round" in done.stdout
    assert "gRPC round trip of a party's bytes, alone" in done.stdout
    assert "distributed: time to first train step, s" in done.stdout


def test_the_wire_floor_is_a_round_trip_to_an_echo_process_over_tls_and_plaintext():
    """A child process echoes the bytes over the run's channel options, with mutual TLS or
    without; the floor is the median round trip (ms), measured, so above zero and finite."""
    for use_tls in (True, False):
        ms = round_trip_ms(64 * 1024, use_tls, count=20)
        assert 0.0 < ms < 5_000.0


def test_the_wire_floor_carries_the_widest_party_s_train_bytes(tmp_path):
    cfg = bench_config(30, parties=2)
    run = RunDir(tmp_path)
    run.label_party.mkdir(parents=True)
    write_outcome(run, {"status": "ok", "embedding_shapes": {"1": [128], "2": [64]}})
    assert step_message_bytes(cfg, run) == 1024 * 128 * 4


def test_steps_per_second_covers_exactly_the_steps_the_timing_spans_cover():
    """Steps WARMUP_STEPS..last (the spans' steps): from the stamp ending step WARMUP_STEPS - 1."""
    gaps = [0.2, 0.1, 0.1, 0.1, 0.1, 0.1105, 0.0436, 0.0736, 0.0570, 0.0278]  # s, steps 0..9
    walls = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    records = [{"type": "train", "step": i, "wall": w} for i, w in enumerate(walls)]
    records.append({"type": "eval", "step": 9, "wall": walls[-1] + 5.0})  # never counted
    steps_per_s = steady_steps_per_second(records)
    assert WARMUP_STEPS == 5 and 1e3 / steps_per_s == pytest.approx(62.5)  # mean of steps 5..9
    budget = {**_budget(1e3 / steps_per_s), "label_compute": 13.9, "label_codec": 0.7,
              "passive_compute": 20.3, "passive_codec": 0.4, "label_update": 1.4}
    assert critical_ratio(budget) == pytest.approx(62.5 / 35.3)
    with pytest.raises(ValueError, match="too few steps"):
        steady_steps_per_second(records[:WARMUP_STEPS])


def test_party_ratios_pair_each_n_with_its_own_baseline_not_a_prefix_of_another():
    names = ["in-process", "in-process 3 threads", "distributed", "distributed+sidecar",
             "in-process N=1", "in-process N=1, 2 threads", "distributed N=1",
             "in-process N=16", "in-process N=16, 17 threads", "distributed N=16"]
    pairs = ratio_pairs([1, 16], names)
    assert pairs["distributed / in-process (2 threads), N=1"] == ("distributed N=1",
                                                               "in-process N=1, 2 threads")
    assert pairs["distributed / in-process (17 threads), N=16"] == ("distributed N=16",
                                                                 "in-process N=16, 17 threads")
    assert all(b.startswith("in-process N=1") and "N=16" not in b
               for a, b in pairs.values() if a == "distributed N=1")
    assert pairs["distributed / in-process (3 threads)"] == ("distributed", "in-process 3 threads")
    assert sum(1 for a, b in pairs.values() if a == "distributed") == 2


def test_the_bench_counts_its_live_zygote_as_its_own_and_waits_for_it_to_settle(monkeypatch):
    class Live:  # the zygote's Popen, alive: here this test's own process
        pid = os.getpid()

        def poll(self) -> None:
            return None

    class Fake:
        children_cpu = 2.0  # CPU-s of the children it forked, ended
        process = Live()
        readied = False

        def ready(self) -> None:
            self.readied = True

    fake = Fake()
    monkeypatch.setattr(zygote_client, "_current", fake)
    assert zygote_client.process_cpu(os.getpid()) > 0  # this test process's own CPU
    assert zygote_client.process_cpu(2 ** 22 + 1) == 0.0  # no such process
    # the live zygote's CPU (here: this process's) counts with its ended children's
    assert zygote_client.children_cpu() >= 2.0 + zygote_client.process_cpu(os.getpid()) - 0.05
    monkeypatch.setattr(zygote_client, "process_cpu", lambda pid: 7.0)  # settled: no CPU growth
    monkeypatch.setattr(zygote_client, "SETTLE_WINDOW", 0.0)
    zygote_client.warm_up(wait=5.0)
    assert fake.readied


def test_the_budget_is_the_median_round_s_whole_and_the_legend_states_the_formula_computed():
    def budget(step: float, waiting: float, transport: float) -> dict[str, float]:
        return {**_budget(step), "label_waiting": waiting, "transport": transport}

    rounds = [budget(35.4, 25.0, 13.7), budget(37.0, 24.0, 9.7), budget(50.5, 26.0, 4.0)]
    assert median_budget(rounds) == rounds[1]  # not transport's own median, 9.7 from elsewhere
    assert median_budget(rounds[::-1]) == rounds[1]
    assert median_budget(rounds[:2]) == rounds[0]  # even: the lower one
    assert "label waits for parties + label update - max(party busy" in LEGEND
    assert "median train step" in LEGEND


def test_bytes_per_step_count_train_steps_only_whatever_the_steps():
    outcome = {"embedding_shapes": {"1": [128], "2": [128]}}
    for steps in (10, 20, 60):
        records = [{"type": "train", "step": i, "batch_size": 1024} for i in range(steps)]
        records.append({"type": "eval", "step": steps - 1, "test_rows": 20_000})
        assert raw_tensor_bytes(records, outcome) / steps == 2 * 1024 * (2 * 128 * 4 + 8) == 2_113_536
    fixed = {"protobuf": 21e6, "wire": 22e6}  # the evaluation and handshakes: in both runs

    def run(steps: int) -> dict[str, float]:
        return {"steps": steps, "raw": 2_113_536 * steps, "protobuf": fixed["protobuf"] + 2.12e6 * steps,
                "wire": fixed["wire"] + 2.15e6 * steps}

    figures = per_train_step(run(20), run(10))
    assert figures["raw_bytes_per_step"] == pytest.approx(2_113_536)
    assert figures["protobuf_bytes_per_step"] == pytest.approx(2.12e6)
    assert figures["wire_bytes_per_step"] == pytest.approx(2.15e6)
    assert figures["wire_over_raw"] == pytest.approx(2.15e6 / 2_113_536)
    assert per_train_step(run(60), run(30)) == pytest.approx(figures)  # the same at any --steps
    with pytest.raises(ValueError, match="no more train steps"):
        per_train_step(run(10), run(10))


def _bench_args(**changes) -> argparse.Namespace:
    return argparse.Namespace(**{"steps": 30, "setup": "ctr", "device": "cpu", "threads": None,
                                 "parties": [], "plaintext": False, "cuda_graphs": False,
                                 **changes})


def test_threads_set_the_header_every_in_process_baseline_and_never_a_duplicate():
    default = bench_variants(_bench_args(), Path("/nonexistent"), Console())  # nothing runs yet
    threads = next(n for n in default if n.endswith(" threads")).split()[1]
    assert f"in-process (1 thread and {threads} threads, as many as the distributed run has)" in (
        bench_header(_bench_args(), 5))
    two = _bench_args(threads=2, parties=[3])
    assert set(bench_variants(two, Path("/nonexistent"), Console())) == {
        "in-process", "in-process 2 threads", "distributed", "distributed+sidecar",
        "in-process N=3", "in-process N=3, 2 threads", "distributed N=3"}
    header = bench_header(_bench_args(threads=2, parties=[3]), 1)
    assert "in-process (1 thread and 2 threads, --threads)" in header and "as many" not in header
    one = _bench_args(threads=1, parties=[2])
    assert set(bench_variants(one, Path("/nonexistent"), Console())) == {
        "in-process", "distributed", "distributed+sidecar", "in-process N=2", "distributed N=2"}
    assert "in-process (1 thread), distributed" in bench_header(_bench_args(threads=1), 1)


def _attacker_bench_args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"exact": False, "completion": False, "rows": None, "dim": None,
                                 "batch_size": None, "steps": None, "vocab": None, **given})


def test_attacker_bench_exact_times_the_rows_asked_in_full_batches_and_a_rest():
    assert batch_rows(3000, 1024) == [1024, 1024, 952] and batch_rows(100, 1024) == [100]
    assert sum(batch_rows(1_000_000, 1024)) == 1_000_000 and batch_rows(2048, 1024) == [1024, 1024]
    args = _attacker_bench_args(exact=True, rows=1_000_000)
    assert bench_mode(args) == "exact" and args.rows == 1_000_000  # not replaced by 8,192
    args = _attacker_bench_args(exact=True)
    assert bench_mode(args) == "exact" and (args.rows, args.vocab) == (8192, 16)
    args = _attacker_bench_args()
    assert bench_mode(args) == "analysis" and args.rows == 1_000_000


def test_attacker_bench_completion_rates_the_steps_alone_and_refuses_flags_it_does_not_read(capsys):
    figures = completion_figures(2.5, [0.1, 0.2, 0.2], 20)  # 2.0 CPU-s of set-up and scoring
    assert figures["setup_cpu"] == pytest.approx(2.0)
    assert figures["steps_per_cpu_second"] == pytest.approx(3 * 20 / 0.5)
    args = _attacker_bench_args(completion=True)
    assert bench_mode(args) == "completion" and args.steps == 2000
    for argv, says in ((["--completion", "--rows", "5", "--dim", "3"], "--completion does not read "
                        "--rows, --dim; it reads only --steps"),
                       (["--steps", "5"], "attacker bench does not read --steps"),
                       (["--exact", "--completion"], "give one")):
        with pytest.raises(SystemExit) as exit_:
            attacker_main(["bench", *argv])
        assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_soak_counts_a_hang_once_samples_no_rss_in_its_own_process_and_fails_every_forbidden_code():
    async def send(channel, payload, timeout) -> str:
        return payload

    admitted = soak.Tally("Train (admitted)")
    asyncio.run(soak._fuzz("127.0.0.1:1", admitted, iter(["OK", soak.HANG, "INTERNAL"]), send,
                           1.0, None, 3))
    assert admitted.rss == [] and admitted.hangs == 1 and admitted.errors == 1
    assert admitted.failures == 2  # both fail the soak
    join = soak.Tally("Join")
    asyncio.run(soak._fuzz("127.0.0.1:1", join, iter(["OK"] * 4), send, 1.0, os.getpid(), 4))
    assert [percent for percent, _ in join.rss] == [0, 25, 50, 75, 100]
    console = Console(record=True, width=200)
    fuzz = {"tallies": {"Join": join, "Train (admitted)": admitted}, "memory": {}, "crashed": []}
    assert soak.print_report(console, fuzz, None) == 1
    text = console.export_text()
    assert "Train (admitted) │     3 │     1 │ " in text and text.count("service RSS") == 1
    assert soak.ERRORS_COLUMN in text and re.search(r"Train \(admitted\) │\s+3 │\s+1 │\s+1 │", text)
    docs = Path("docs/benchmarks.md").read_text()
    for code in soak.FORBIDDEN - {soak.HANG}:  # the exit status as documented
        assert code in docs
        alone = soak.Tally("Record")
        alone.counts[code] += 1
        assert soak.print_report(Console(record=True), {
            "tallies": {"Record": alone}, "memory": {}, "crashed": []}, None) == 1


def test_an_interval_equal_to_the_range_but_for_the_last_bits_is_not_printed_twice():
    s = {"median": 1.04, "min": 0.85, "max": 1.1189617498733566, "n": 3,
         "ci95": [0.85, 1.1189617498733564]}
    assert describe(s) == "1.04 [0.85–1.12] (3 rounds)"
    assert "95 % CI 0.86–1.11" in describe({**s, "ci95": [0.86, 1.11]})


def test_the_gpu_sized_set_up_on_the_cpu_is_warned_of_before_any_round(monkeypatch, capsys):
    class Stop(Exception):
        pass

    def stop(wait: float = 0.0) -> None:
        if wait:  # the bench's own warm-up, the first thing after its header: no round runs
            raise Stop

    monkeypatch.setattr(zygote_client, "warm_up", stop)
    with pytest.raises(Stop):
        main(["bench", "--setup", "cifar-resnet18", "--device", "cpu", "--quick"])
    said = " ".join(capsys.readouterr().out.split())
    assert "--setup cifar-resnet18 is sized for a GPU" in said and "--device cuda" in said
    with pytest.raises(Stop):
        main(["bench", "--device", "cpu", "--quick"])
    assert "sized for a GPU" not in capsys.readouterr().out
