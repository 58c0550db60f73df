"""The trade-off report on hand-made run directories: t intervals, paired utility drop, VFLAIR's
DCS / T-DCS / C-DCS and ours, the Pareto frontier, trends, the files it writes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy import stats

from attacker.attacks import ATTACKS
from orchestration.cli import main
from orchestration.compare.dcs import chance, dcs
from orchestration.compare.entries import leak_entries
from orchestration.compare.read import find_runs
from orchestration.compare.report import write_report
from orchestration.compare.stats import over_seeds
from orchestration.compare.table import compare
from orchestration.compare.trends import trends
from orchestration.sweep.index import SweepIndex
from orchestration.sweep.points import resolve
from orchestration.sweep.spec import parse_sweep
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import write_config
from splitleak.artifacts.summary import LeakSummary
from splitleak.cli_common import BadInput
from splitleak.config import parse_config
from tests.conftest import small_config

SEEDS = (0, 1, 2)
# setting -> (defense chain, test AUC per seed, norm leak (flipped mean, p95) per seed)
SETTINGS: dict[str, tuple[list[dict], list[float], list[tuple[float, float]]]] = {
    "none": ([], [0.95, 0.96, 0.97], [(0.90, 0.95), (0.92, 0.96), (0.94, 0.97)]),
    "marvell 1": ([{"name": "marvell", "s": 1.0}], [0.93, 0.94, 0.95],
                  [(0.70, 0.80), (0.72, 0.81), (0.74, 0.82)]),
    "marvell 4": ([{"name": "marvell", "s": 4.0}], [0.90, 0.91, 0.92],
                  [(0.60, 0.65), (0.62, 0.66), (0.64, 0.67)]),
    "iso 1": ([{"name": "iso", "t": 1.0}], [0.90, 0.91, 0.92], [(0.85, 0.90), (0.86, 0.91), (0.87, 0.92)]),
}


def declared(attack: str) -> dict[str, Any]:
    """The VFLAIR family and name the attack's plug-in declares, as a current analysis writes
    them into its entry (an attack no plug-in has: label inference, no VFLAIR counterpart)."""
    name = attack.split("(")[0]
    cls = ATTACKS.get(name) if name in ATTACKS.names() else None
    return {"family": cls.family if cls else "label_inference", "vflair": cls.vflair if cls else None}


def leak_entry(attack: str, mean: float, p95: float, **extra: Any) -> dict[str, Any]:
    """A score attack's run entry; its threshold accuracy (VFLAIR's AP) is the AUC mean − 0.1."""
    return {"scope": "run", "party_id": 1, "layer": "cut", "attack": attack, **declared(attack),
            "metric": "auc",
            "side_knowledge": "none", "batches": 10, "skipped": 0,
            "flipped": {"mean": mean, "p95": p95, "max": p95}, "raw": {"mean": 1 - mean, "p95": 0.5,
                                                                         "max": 0.5},
            "threshold_accuracy": {"mean": mean - 0.1, "p95": p95, "max": p95},
            "threshold_rule": "positive where the min-max normalised score is > 0.5", **extra}


def fake_run(root: Path, data: dict[str, Any], utility: float, leak: list[dict[str, Any]],
             num_classes: int = 2) -> Path:
    """What a finished, analysed run leaves that compare reads."""
    cfg = parse_config(data)
    run = RunDir(root)
    run.label_party.mkdir(parents=True)
    write_config(cfg, run)
    key = "test_auc" if num_classes == 2 else "test_accuracy"
    records = [{"type": "plan", "num_classes": num_classes}, {"type": "eval", key: utility - 0.1},
               {"type": "eval", key: utility, "test_loss": 0.3}]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    run.report.mkdir()
    summary = {"num_classes": num_classes,
               "leak": [*leak, {**leak[0], "scope": "epoch", "epoch": 0, "flipped": {"mean": 0.0}}]}
    (run.report / "summary.json").write_text(json.dumps(summary))
    return root


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    for name, (chain, utilities, leaks) in SETTINGS.items():
        for seed, utility, (mean, p95) in zip(SEEDS, utilities, leaks, strict=True):
            data = small_config(tmp_path, run={"seed": seed, "name": name.replace(" ", "_")},
                                defense=chain)
            fake_run(tmp_path / "runs" / f"{name.replace(' ', '_')}-{seed}", data, utility,
                     [leak_entry("norm", mean, p95)])
    return tmp_path / "runs"


def test_over_seeds_is_the_student_t_interval() -> None:
    values = [0.93, 0.94, 0.96]
    summary = over_seeds(values, higher_is_better=True)
    half = stats.t.ppf(0.975, 2) * np.std(values, ddof=1) / math.sqrt(3)
    assert summary.mean == pytest.approx(np.mean(values))
    mean = np.mean(values)
    assert (summary.ci_low, summary.ci_high) == pytest.approx((mean - half, mean + half))
    assert (summary.worst, summary.best) == (0.93, 0.96)
    leak = over_seeds(values, higher_is_better=False)
    assert (leak.worst, leak.best) == (0.96, 0.93)
    single = over_seeds([0.5, None], higher_is_better=True)
    assert single.n == 1 and math.isnan(single.ci_low)
    assert over_seeds([0.5, 0.5, 0.5], True).ci_low == 0.5  # no spread: a zero-width interval
    assert over_seeds([None], True) is None


def test_dcs_is_vflairs_formula() -> None:
    # VFLAIR cal_dcs(mp, ap, mp0, ap0=0, beta=0.5): distance on the gaps that hurt, clipped at 0
    assert dcs(0.8, 0.9, 0.95) == pytest.approx(1 / (1 + math.sqrt(0.5 * 0.8 ** 2 + 0.5 * 0.05 ** 2)))
    assert dcs(0.0, 0.97, 0.95) == 1.0  # no attack success, no utility lost
    assert dcs(0.6, 0.9, 0.95, ap_star=0.5) == pytest.approx(
        1 / (1 + math.sqrt(0.5 * 0.1 ** 2 + 0.5 * 0.05 ** 2)))
    assert dcs(0.4, 0.9, 0.9, ap_star=0.5) == 1.0  # below chance is no leak in ours
    assert chance("auc", 2) == 0.5 and chance("accuracy", 10) == pytest.approx(0.1)


def test_leak_entries_read_todays_summary_and_the_spread_and_pooled_extensions() -> None:
    summary = {"leak": [
        leak_entry("norm", 0.8, 0.9),
        leak_entry("cosine_oracle", 0.7, 0.8, spread={"flipped": {"mean": 0.02, "p95": 0.03}}),
        {"scope": "run", "party_id": 1, "layer": "cut", "attack": "direct_label", "metric": "accuracy",
         "side_knowledge": "none", "accuracy": {"mean": 0.5, "p95": 0.9, "max": 1.0, "pooled": 0.4},
         "spread": 0.01},
        {"scope": "run", "party_id": 2, "layer": "first", "attack": "x", "metric": "accuracy",
         "accuracy": {"mean": 0.3}},
        {"scope": "epoch", "party_id": 1, "layer": "cut", "attack": "norm", "flipped": {"mean": 0.0}},
    ]}
    norm, cosine, direct, other = leak_entries(LeakSummary.model_validate(summary))
    assert (norm.flipped_mean, norm.flipped_p95, norm.raw_mean, norm.spread) == (0.8, 0.9, pytest.approx(0.2),
                                                                                 None)
    assert cosine.spread == 0.02 and cosine.attack_type == "label inference"
    assert direct.metric == "accuracy" and direct.accuracy == 0.4 and direct.spread == 0.01
    assert other.accuracy == 0.3 and other.party == 2 and other.layer == "first"


def test_leak_entries_read_what_the_analysis_writes() -> None:
    """The summary layout of attacker.analysis.summary: spread per statistic, pooled accuracy, count error
    (read too: compare shows it, unranked), each attack's metric over batches."""
    from attacker.analysis.summary import summarise_leak

    def row(attack: str, step: int, draw: int, **fields: Any) -> dict[str, Any]:
        return {"party_id": 1, "parties": "1", "layer": "cut", "epoch": 0, "step": step, "attack": attack,
                "side_knowledge": "k", "seed": 0, "draw": draw, "skip_reason": None, **fields}

    rows = [row("hint_distance(k=1)", step, draw, metric="auc", auc_raw=value, auc_flipped=value)
            for step in range(4) for draw, value in ((0, 0.6 + 0.01 * step), (1, 0.8 + 0.01 * step))]
    rows += [row("direct_label", step, 0, metric="accuracy", accuracy=0.5, n_correct=n, n_predicted=10,
                 n_no_prediction=0) for step, n in enumerate((2, 8))]
    rows += [row("batch_label_counts", 0, 0, metric="count_error", count_error=0.1)]
    hint, direct, counts = leak_entries(LeakSummary.model_validate({"leak": summarise_leak(rows)}))
    p95 = [float(np.percentile([base + 0.01 * s for s in range(4)], 95)) for base in (0.6, 0.8)]
    assert hint.spread == pytest.approx(float(np.std(p95, ddof=1)))
    assert hint.flipped_p95 == pytest.approx(float(np.mean(p95)))
    assert hint.batch_p95 == hint.flipped_p95 and hint.batch_mean == hint.flipped_mean
    assert direct.accuracy == pytest.approx(0.5) and direct.metric == "accuracy"  # 10 of 20 rows
    assert direct.batch_mean == 0.5 and direct.batch_p95 == 0.5  # per batch, not pooled
    assert counts.metric == "count_error" and counts.batch_mean == pytest.approx(0.1)
    assert counts.accuracy is None


def test_compare_pairs_seeds_and_finds_the_frontier(runs_dir: Path) -> None:
    runs, warnings = find_runs([runs_dir])
    assert len(runs) == 12 and not warnings
    comparison = compare(runs, dcs_ap="auc")  # splitleak's earlier DCS: AP = mean flipped AUC
    rows = {r["setting"]: r for r in comparison.rows}
    assert set(rows) == {"no defense", "marvell s=1", "marvell s=4", "iso t=1"}
    assert comparison.party == 1 and not comparison.warnings
    m4 = rows["marvell s=4"]
    assert m4["utility_mean"] == pytest.approx(0.91) and m4["n_seeds"] == 3
    assert m4["utility_drop_mean"] == pytest.approx(0.05)  # the same seed's no-defense run
    assert m4["utility_worst"] == 0.90 and m4["utility_best"] == 0.92
    assert m4["leak_mean"] == pytest.approx(0.66)  # p95 is the default headline
    assert m4["leak_flipped_mean_mean"] == pytest.approx(0.62)
    assert m4["leak_worst"] == 0.67 and m4["leak_best"] == 0.65
    half = stats.t.ppf(0.975, 2) * 0.01 / math.sqrt(3)
    assert (m4["leak_ci_low"], m4["leak_ci_high"]) == pytest.approx((0.66 - half, 0.66 + half))
    per_seed = [dcs(ap, mp, star) for ap, mp, star in zip([0.6, 0.62, 0.64], [0.90, 0.91, 0.92],
                                                          [0.95, 0.96, 0.97], strict=True)]
    assert m4["dcs_mean"] == pytest.approx(np.mean(per_seed))
    assert m4["dcs_ours_mean"] == pytest.approx(np.mean(
        [dcs(ap, mp, star, 0.5) for ap, mp, star in zip([0.6, 0.62, 0.64], [0.90, 0.91, 0.92],
                                                        [0.95, 0.96, 0.97], strict=True)]))
    assert m4["dcs_of_means"] == pytest.approx(dcs(0.62, 0.91, 0.96))
    assert m4["t_dcs_mean"] == pytest.approx(m4["dcs_mean"]) == pytest.approx(m4["c_dcs_mean"])
    assert {s: r["pareto"] for s, r in rows.items()} == {
        "no defense": True, "marvell s=1": True, "marvell s=4": True, "iso t=1": False}
    assert rows["no defense"]["baseline"] == "no defense" and rows["no defense"]["utility_drop_mean"] == 0
    (marvell,) = [t for t in trends(comparison.rows) if t.family == "marvell"]
    assert marvell.parameter == "marvell.s" and marvell.direction == "falls"
    assert [v for v, _ in marvell.levels] == [1.0, 4.0]


def test_compare_says_what_it_cannot_compute(runs_dir: Path, tmp_path: Path) -> None:
    lonely = small_config(tmp_path, run={"seed": 0}, training={"batch_size": 32},
                          defense=[{"name": "iso", "t": 2.0}])
    fake_run(runs_dir / "lonely", lonely, 0.9, [leak_entry("norm", 0.7, 0.8)])
    (runs_dir / "unanalysed").mkdir()
    (runs_dir / "unanalysed" / "config.toml").write_text("")
    runs, warnings = find_runs([runs_dir])
    assert any("unanalysed: no label_party/metrics.jsonl" in w for w in warnings)
    comparison = compare(runs, warnings=warnings)
    row = next(r for r in comparison.rows if r["setting"] == "iso t=2")
    assert row["dcs_mean"] is None and row["utility_drop_mean"] is None and row["baseline"] is None
    assert any("iso t=2: 1 seed(s)" in w for w in comparison.warnings)
    assert any("iso t=2: no run of the same set-up without a defense" in w for w in comparison.warnings)


def test_compare_names_the_layers_the_runs_have(runs_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    """The runs have a cut-layer leak only: a sweep's own comparison at another layer compares
    at the one layer measured and says so (a model-completion sweep, kdk_sweep.toml, printed
    'no comparison at the cut layer' and wrote no report); asked for, that layer is refused."""
    from rich.console import Console

    from orchestration.compare.command import compare_and_print

    comparison = compare_and_print([runs_dir], tmp_path / "out", Console(width=100),
                                   layer="bottom", layer_asked=False)
    assert comparison is not None and comparison.layer == "cut"
    assert (tmp_path / "out" / "report.md").exists()
    out = " ".join(capsys.readouterr().out.split())
    assert "comparing at the cut layer: the compared runs measured a leak there only, not at " \
           "the bottom layer" in out
    with pytest.raises(BadInput):
        compare_and_print([runs_dir], tmp_path / "asked", Console(width=100), layer="bottom")
    assert "--layer bottom: the compared runs measured a leak at cut" in capsys.readouterr().err


def test_report_files(runs_dir: Path, tmp_path: Path) -> None:
    runs, _ = find_runs([runs_dir])
    out = tmp_path / "compare"
    report = write_report(compare(runs), out, [runs_dir])
    table = pq.read_table(out / "table.parquet")
    assert table.num_rows == 4 and {"utility_ci_low", "dcs_mean", "pareto"} <= set(table.column_names)
    assert (out / "table.csv").read_text().startswith('"setting"')
    assert (out / "leak_vs_utility_norm.png").stat().st_size > 10_000
    assert (out / "strength_marvell.png").stat().st_size > 10_000
    text = report.read_text()
    for part in ("## norm", "## Defense capability (VFLAIR's DCS)", "## Leak vs strength", "| marvell | "
                 "marvell.s | – | norm |", "](leak_vs_utility_norm.png)", "0.910 ["):
        assert part in text, part


def test_compare_reads_a_sweep_index(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = parse_config(small_config(tmp_path))
    sweep = parse_sweep({"sweep": {"name": "s", "seeds": [0, 1]}})
    points = resolve(sweep, base, tmp_path / "s")
    index = SweepIndex(tmp_path / "s", points, "local")
    for point in points:
        fake_run(point.run_dir, point.config.model_dump(mode="json"), 0.9, [leak_entry("norm", 0.8, 0.9)])
    index.mark(points[0], "done", 1.0)
    index.mark(points[1], "failed", 1.0, "boom")
    runs, warnings = find_runs([tmp_path / "s"])
    assert [r.root for r in runs] == [points[0].run_dir] and runs[0].label == "t"
    assert warnings == [f"{tmp_path / 's'}: 1 of 2 points are not done (1 failed); this "
                        "comparison covers the 1 done"]
    assert main(["compare", str(tmp_path / "s")]) == 0
    assert (tmp_path / "s" / "compare" / "report.md").exists()
    out = " ".join(capsys.readouterr().out.split())
    assert "trade-off report" in out and "1 of 2 points are not done (1 failed)" in out
    # the sweep and one of its points: the run once, as the sweep names it, and no traceback
    runs, warnings = find_runs([tmp_path / "s", points[0].run_dir])
    assert [r.label for r in runs] == ["t"] and any("given twice" in w for w in warnings)
    assert main(["compare", str(points[0].run_dir), str(tmp_path / "s"),
                 "--output-dir", str(tmp_path / "both")]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(tmp_path)])  # neither a sweep nor run directories
    assert exit_info.value.code == 2 and "not a sweep directory" in capsys.readouterr().err


def test_trends_of_a_two_parameter_grid() -> None:
    rows = [{"family": "kdk", "setup": "s", "attack": "direct_label", "leak_mean": 0.5 - eps / 2 - k / 100,
             "strengths": json.dumps({"kdk.epsilon": eps, "kdk.k": k, "kdk.teacher_lr": 0.001})}
            for eps in (0.2, 0.5) for k in (2, 3, 5)]
    rows[-1]["leak_mean"] = 0.9  # eps 0.5, k 5: breaks the fall along k
    found = {(t.parameter, tuple(t.fixed.items())): t for t in trends(rows)}
    assert set(found) == {("kdk.epsilon", (("kdk.k", 2),)), ("kdk.epsilon", (("kdk.k", 3),)),
                          ("kdk.epsilon", (("kdk.k", 5),)), ("kdk.k", (("kdk.epsilon", 0.2),)),
                          ("kdk.k", (("kdk.epsilon", 0.5),))}  # the constant teacher_lr is not held
    assert found[("kdk.k", (("kdk.epsilon", 0.2),))].direction == "falls"
    assert found[("kdk.k", (("kdk.epsilon", 0.2),))].spearman == pytest.approx(-1.0)
    assert found[("kdk.k", (("kdk.epsilon", 0.5),))].direction == "mixed"
    assert found[("kdk.epsilon", (("kdk.k", 5),))].direction == "rises"


def _paced_run(root: Path, data: dict[str, Any], step_s: float, curve: list[tuple[float, float]],
               attacks: list[str]) -> None:
    """A run whose train steps take `step_s` and whose evaluations score `curve` (wall, AUC)."""
    fake_run(root, data, curve[-1][1], [leak_entry(a, 0.8, 0.9) for a in attacks])
    run = RunDir(root)
    records = [{"type": "plan", "num_classes": 2},
               *({"type": "train", "step": i, "wall": i * step_s} for i in range(5)),
               *({"type": "eval", "wall": wall, "test_auc": auc} for wall, auc in curve)]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    run.outcome.write_text(json.dumps({"status": "ok", "bytes_sent": 4096, "bytes_received": 6144}))


def test_speed_of_lan_and_wan_settings(tmp_path: Path) -> None:
    """[network] and [wire] are not the set-up: a WAN run is compared against the LAN run without
    a defense; a float16 wire counts as a defense; the Speed section and the terminal tables
    give ms per step, the time to the utility every run reached and KiB per step."""
    from rich.console import Console

    from orchestration.compare.command import speed_table, summary_table

    wan = {"one_way_latency_ms": 25.0, "bandwidth_mbit": 100.0}
    attacks = ["norm", "cosine_oracle", "mean(centers=oracle)", "median(centers=oracle)"]
    for seed in (0, 1):
        for name, extra, step_s, curve in [
                ("lan", {}, 0.02, [(1.0, 0.70), (2.0, 0.80)]),
                ("wan", {"network": wan}, 0.16, [(8.0, 0.75), (16.0, 0.79)]),
                ("wan16", {"network": wan, "wire": {"dtype": "float16"}}, 0.12,
                 [(6.0, 0.78), (12.0, 0.80)])]:
            data = small_config(tmp_path, run={"seed": seed, "name": name}, **extra)
            _paced_run(tmp_path / "runs" / f"{name}-{seed}", data, step_s, curve, attacks)
    runs, _ = find_runs([tmp_path / "runs"])
    comparison = compare(runs)
    by_label = {s.family + " " + s.first.config.network.describe(): s for s in comparison.settings}
    assert set(by_label) == {"no defense LAN", "no defense 25 ms one-way, 100 Mbit/s",
                             "float16 wire 25 ms one-way, 100 Mbit/s"}
    lan = by_label["no defense LAN"]
    assert all(s.baseline is lan for s in comparison.settings)
    assert comparison.about_speed() and comparison.speed_target == 0.79  # the lowest final
    speed = {s.first.config.network.describe() + s.first.config.wire.dtype: comparison.speed[s.key]
             for s in comparison.settings}
    assert speed["LANfloat32"]["ms_per_step_mean"] == pytest.approx(20.0)
    assert speed["LANfloat32"]["seconds_to_target_mean"] == 2.0
    assert speed["25 ms one-way, 100 Mbit/sfloat32"]["seconds_to_target_mean"] == 16.0
    assert speed["25 ms one-way, 100 Mbit/sfloat16"]["seconds_to_target_mean"] == 12.0  # 0.78 < 0.79
    assert speed["LANfloat32"]["kib_per_step"] == pytest.approx(10240 / 5 / 1024)
    report = write_report(comparison, tmp_path / "compare", [tmp_path / "runs"]).read_text()
    assert "## Speed" in report and "| 25 ms one-way, 100 Mbit/s | float16 | 120.000" in report
    console = Console(record=True, width=80)
    console.print(summary_table(comparison, 80))
    console.print(speed_table(comparison))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80
    assert "A2 = cosine_oracle" in text  # four long attack names do not fit: numbered
    assert "s to 0.790" in text and "25 ms, 100 Mbit/s" in text and "120.0" in text
    asked = compare(runs, target=0.8)  # above the WAN float32 runs' final 0.79
    assert not asked.speed_target_is_common
    text = write_report(asked, tmp_path / "asked", [tmp_path / "runs"]).read_text()
    assert "(0 of 2 runs reached it)" in text and "(the utility asked for)" in text
    wide = Console(record=True, width=200)
    wide.print(summary_table(comparison, 200))
    assert "median(centers=oracle)" in wide.export_text().splitlines()[1]


def test_count_attacks_are_shown_with_their_change_but_not_ranked(tmp_path: Path) -> None:
    """A count error falls as the attacker learns more: compare shows it (mean and p95 over
    batches, change against no defense) but puts it on no frontier and gives it no verdict; its
    DCS comes from its attack performance, 1 − count error (VFLAIR's BLI)."""
    gp = [{"name": "grad_perturb", "epsilon": 1.0}]
    for name, chain, utility, error in (("none", [], 0.97, 0.1), ("gp", gp, 0.94, 0.2)):
        for seed in SEEDS:
            data = small_config(tmp_path, run={"seed": seed, "name": name}, defense=chain)
            counts = {"scope": "run", "party_id": 1, "layer": "cut", "attack": "batch_label_counts",
                      "metric": "count_error", "count_error": {"mean": error + 0.01 * seed, "p95": 0.5}}
            fake_run(tmp_path / "runs" / f"{name}-{seed}", data, utility,
                     [leak_entry("norm", 0.9 - error, 0.95 - error), counts], num_classes=10)
    comparison = compare(find_runs([tmp_path / "runs"])[0])
    rows = {(r["setting"], r["attack"]): r for r in comparison.rows}
    counted = rows[("grad_perturb epsilon=1", "batch_label_counts")]
    assert counted["metric"] == "count_error" and counted["headline"] == "batch_mean"
    assert counted["leak_mean"] == pytest.approx(0.21) and counted["leak_batch_p95_mean"] == 0.5
    assert counted["leak_change_mean"] == pytest.approx(np.mean([(0.2 + d) / (0.1 + d) - 1
                                                                 for d in (0, 0.01, 0.02)]))
    assert not counted["ranked"] and not counted["pareto"]
    assert counted["ap_mean"] == pytest.approx(1 - 0.21)
    assert counted["dcs_mean"] == pytest.approx(np.mean([dcs(0.8 - d, 0.94, 0.97) for d in (0, 0.01, 0.02)]))
    assert rows[("no defense", "batch_label_counts")]["pareto"] is False
    assert [v.attack for v in comparison.verdicts()] == ["norm"]
    text = write_report(comparison, tmp_path / "out", [tmp_path]).read_text()
    assert "**Not ranked**: a count error falls as the attacker learns more; its attack" in text
    assert "| count error [CI] | batch mean / p95 |" in text
    assert not (tmp_path / "out" / "leak_vs_utility_batch_label_counts.png").exists()


def test_a_layer_the_runs_lack_is_refused_before_anything_is_written(
        runs_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "report"
    assert main(["compare", str(runs_dir), "--output-dir", str(out)]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(runs_dir), "--output-dir", str(out), "--layer", "input"])
    assert exit_info.value.code == 2
    assert "--layer input: the compared runs measured a leak at cut; give one of those" in \
        " ".join(capsys.readouterr().err.split())
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


def test_runs_of_different_tasks_are_named(tmp_path: Path) -> None:
    binary = small_config(tmp_path, run={"seed": 0, "name": "bc"})
    digits = small_config(tmp_path, run={"seed": 0, "name": "dg"}, dataset={"name": "digits"},
                          features={"passive": [[0, 4], [4, 8]]})
    fake_run(tmp_path / "runs" / "bc", binary, 0.95, [leak_entry("norm", 0.8, 0.9)])
    fake_run(tmp_path / "runs" / "dg", digits, 0.85, [leak_entry("norm", 0.7, 0.8)], num_classes=10)
    runs, _ = find_runs([tmp_path / "runs"])
    warnings = compare(runs).warnings
    assert ("these runs are of different tasks (test accuracy for digits; test AUC for "
            "breast_cancer): their utilities are not on one scale") in warnings, warnings


def test_an_attack_some_seeds_lack_is_named_and_the_utility_is_every_seeds(runs_dir: Path) -> None:
    summary = runs_dir / "marvell_4-1" / "report" / "summary.json"
    summary.write_text(json.dumps({"num_classes": 2, "leak": [leak_entry("other", 0.6, 0.7)]}))
    runs, _ = find_runs([runs_dir])
    comparison = compare(runs)
    row = next(r for r in comparison.rows if r["setting"] == "marvell s=4" and r["attack"] == "norm")
    assert row["n_seeds"] == 2 and row["utility_mean"] == pytest.approx(0.91)  # all three seeds
    assert ("marvell s=4: norm is measured in 2 of its 3 seeds' runs; its summaries lack it in "
            "marvell_4-1 (seed 1)") in comparison.warnings, comparison.warnings


def test_an_interrupted_report_leaves_the_previous_one_whole(
        runs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestration.compare import report as report_module

    runs, _ = find_runs([runs_dir])
    out = tmp_path / "compare"
    write_report(compare(runs), out, [runs_dir])
    before = {f.name: f.read_bytes() for f in out.iterdir()}

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(report_module, "_draw", interrupted)  # after the tables were written
    with pytest.raises(KeyboardInterrupt):
        write_report(compare(runs, leak_stat="flipped_mean"), out, [runs_dir])
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


# --- the statistics a probe recomputed by hand -----------------------------------------------


def _settings(tmp_path: Path, settings: dict[str, tuple[list, dict[int, float], dict[int, tuple]]],
              extra: Any = lambda name, seed: []) -> list:
    """Fake analysed runs: setting name -> (defense chain, utility by seed, (mean, p95) of norm)."""
    for name, (chain, utility, leak) in settings.items():
        for seed, u in utility.items():
            data = small_config(tmp_path, run={"seed": seed, "name": name}, defense=chain)
            fake_run(tmp_path / "runs" / f"{name}-{seed}", data, u,
                     [leak_entry("norm", *leak[seed]), *extra(name, seed)])
    return find_runs([tmp_path / "runs"])[0]


MARVELL = [{"name": "marvell", "s": 1.0}]


def test_a_utility_cost_of_exactly_the_budget_is_affordable(tmp_path: Path) -> None:
    """0.95 - 0.94 is 0.010000000000000009 in floats: the verdict said "no defense"."""
    runs = _settings(tmp_path, {
        "plain": ([], {0: 0.95, 1: 0.96, 2: 0.97}, {s: (0.9, 0.96) for s in range(3)}),
        "marvell": (MARVELL, {0: 0.94, 1: 0.95, 2: 0.96}, {s: (0.6, 0.70) for s in range(3)})})
    (verdict,) = compare(runs, max_utility_cost=0.01).verdicts()
    assert verdict.best is not None and verdict.best["setting"] == "marvell s=1", verdict.sentence()


def test_seeds_the_baseline_lacks_are_warned_of_and_left_out_of_the_dcs_of_means(tmp_path: Path) -> None:
    runs = _settings(tmp_path, {
        "plain": ([], {0: 0.95, 1: 0.96}, {0: (0.9, 0.95), 1: (0.92, 0.96)}),
        "marvell": (MARVELL, {0: 0.94, 1: 0.95, 2: 0.80}, {s: (0.6, 0.65) for s in range(3)})})
    comparison = compare(runs)
    row = next(r for r in comparison.rows if r["setting"] == "marvell s=1")
    assert row["n_seeds"] == 3 and row["utility_drop_mean"] == pytest.approx(0.01)
    assert any(w.startswith("marvell s=1: its no-defense baseline (no defense) lacks seed 2")
               for w in comparison.warnings), comparison.warnings
    # threshold accuracy (the AP) 0.5 on seeds 0 and 1, against the paired baseline's 0.955
    assert row["dcs_of_means"] == pytest.approx(dcs(0.5, 0.945, 0.955))


def test_for_a_count_error_the_worst_seed_is_the_lowest(tmp_path: Path) -> None:
    """A count error falls as the attacker learns more: worst = the most leak = the lowest."""
    def counts(name: str, seed: int) -> list[dict[str, Any]]:
        error = (0.1 if name == "plain" else 0.2) + 0.05 * seed
        return [{"scope": "run", "party_id": 1, "layer": "cut", "attack": "batch_label_counts",
                 "metric": "count_error", "count_error": {"mean": error, "p95": 0.5}}]

    runs = _settings(tmp_path, {
        "plain": ([], {0: 0.95, 1: 0.96, 2: 0.97}, {s: (0.9, 0.96) for s in range(3)}),
        "marvell": (MARVELL, {0: 0.94, 1: 0.95, 2: 0.96}, {s: (0.6, 0.7) for s in range(3)})}, counts)
    row = next(r for r in compare(runs).rows
               if r["setting"] == "marvell s=1" and r["attack"] == "batch_label_counts")
    assert (row["leak_worst"], row["leak_best"]) == (pytest.approx(0.2), pytest.approx(0.3))


def test_the_capability_section_reads_the_party_asked_for(tmp_path: Path) -> None:
    def at_party_2(name: str, seed: int) -> list[dict[str, Any]]:
        return [{**leak_entry("norm", 0.99 if name == "plain" else 0.98, 0.99), "party_id": 2}]

    runs = _settings(tmp_path, {
        "plain": ([], {0: 0.95, 1: 0.96, 2: 0.97}, {s: (0.9, 0.96) for s in range(3)}),
        "marvell": (MARVELL, {0: 0.94, 1: 0.95, 2: 0.96}, {s: (0.6, 0.7) for s in range(3)})}, at_party_2)
    comparison = compare(runs, party=2)
    cut = [r for r in comparison.capability if r["layer"] == "cut"]
    assert cut and {r["party"] for r in cut} == {2}
    table = next(r for r in comparison.rows if r["setting"] == "marvell s=1")
    marvell = next(r for r in cut if r["setting"] == "marvell s=1")
    assert marvell["c_dcs_mean"] == pytest.approx(table["dcs_mean"])  # one attack: T-DCS = its DCS


def test_a_leak_that_does_not_move_with_strength_is_flat(tmp_path: Path) -> None:
    runs = _settings(tmp_path, {
        "plain": ([], {0: 0.95, 1: 0.96, 2: 0.97}, {s: (0.9, 0.96) for s in range(3)}),
        **{f"marvell{s:g}": ([{"name": "marvell", "s": s}], {0: 0.94, 1: 0.95, 2: 0.96},
                             {seed: (0.6, 0.7) for seed in range(3)}) for s in (1.0, 2.0, 4.0)}})
    (trend,) = trends(compare(runs).rows)
    assert trend.direction == "flat"


def test_a_count_error_that_rises_with_strength_is_a_leak_that_falls(tmp_path: Path) -> None:
    def counts(name: str, seed: int) -> list[dict[str, Any]]:
        error = {"plain": 0.05, "marvell1": 0.1, "marvell2": 0.2, "marvell4": 0.3}[name]
        return [{"scope": "run", "party_id": 1, "layer": "cut", "attack": "batch_label_counts",
                 "metric": "count_error", "count_error": {"mean": error, "p95": 0.5}}]

    runs = _settings(tmp_path, {
        "plain": ([], {0: 0.95, 1: 0.96, 2: 0.97}, {s: (0.9, 0.96) for s in range(3)}),
        **{f"marvell{s:g}": ([{"name": "marvell", "s": s}], {0: 0.94, 1: 0.95, 2: 0.96},
                             {seed: (0.9 - 0.1 * s, 0.95 - 0.1 * s) for seed in range(3)})
           for s in (1.0, 2.0, 4.0)}}, counts)
    found = {t.attack: t.direction for t in trends(compare(runs).rows)}
    assert found == {"norm": "falls", "batch_label_counts": "falls"}
