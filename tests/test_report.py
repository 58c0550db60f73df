"""The leak report on a hand-built run directory: numbers in report.md, valid PNGs, missing inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from attacker.analysis.analyze import LEAK_SCHEMA, summarise_leak
from attacker.analysis.leak import METRIC_OF_KIND
from attacker.analysis.summary import above_bound, marvell_bounds
from attacker.attacks import DEFAULT_ATTACKS, DEFAULT_MULTICLASS_ATTACKS, build_attack
from attacker.report.cells import side_knowledge_tag
from attacker.report.report import utility, write_report
from attacker.report.terminal import comparison_table, print_leak_table
from splitleak.artifacts.metrics_log import MetricsLog
from splitleak.artifacts.paths import RunDir
from splitleak.threat import ThreatConfig

SEED = 7
STEPS = 21  # scored batches; one more, skipped, follows
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _leak_rows(attacks: list[tuple[str, dict]], layers: tuple[str, ...],
               num_classes: int = 2) -> list[dict[str, Any]]:
    """Per-batch rows: norm at the cut layer scores 0.50, 0.52, ..., 0.90 (p95 0.880); the
    cosine oracle's raw AUC is 1 - that (raw p95 0.480, flipped p95 0.880); a last batch is skipped."""
    rng = np.random.default_rng(0)
    rows = []
    for layer in layers:
        for step in range(STEPS + 1):
            for name, params in attacks:
                attack = build_attack(name, params)
                value = 0.5 + 0.02 * step if layer == "cut" else float(rng.uniform(0.5, 1.0))
                skipped = step == STEPS
                metric = METRIC_OF_KIND[attack.metric_kind(num_classes)]
                auc = metric == "auc"
                raw = 1.0 - value if name == "cosine_oracle" else value
                rows.append({
                    "party_id": 1, "layer": layer, "epoch": step // 11, "step": step, "attack": attack.label,
                    "name": name, "side_knowledge": attack.side_knowledge, "metric": metric,
                    "auc_raw": raw if auc and not skipped else None,
                    "auc_flipped": max(raw, 1.0 - raw) if auc and not skipped else None,
                    "accuracy": value if metric == "accuracy" and not skipped else None,
                    "count_error": value if metric == "count_error" and not skipped else None,
                    "n_rows": 64, "n_excluded": 0, "n_pos": 12 if auc else None,
                    "skip_reason": "single class in batch (all 0)" if skipped else None, "seed": SEED})
    return rows


def _sample_rows() -> pa.Table:
    rng = np.random.default_rng(1)
    rows = []
    for layer in ("cut", "first"):
        for phase, steps in (("early", range(5)), ("late", range(16, 21))):
            for step in steps:
                for label in rng.integers(0, 2, size=40):
                    rows.append({"party_id": 1, "layer": layer, "step": step, "label": int(label),
                                 "norm": float(rng.lognormal(-8 + 2 * label, 1.0)),
                                 "cosine_oracle": float(np.clip(rng.normal(0.6 * label - 0.3, 0.2), -1, 1)),
                                 "phase": phase})
    return pa.Table.from_pylist(rows)


def make_run(root: Path, *, multiclass: bool = False, first_layer: bool = True, row_sample: bool = True,
             evals: bool = True, defense: bool = True) -> tuple[RunDir, dict[str, Any]]:
    """A run directory written by hand, and the summary the analysis would return for it."""
    run = RunDir(root)
    (root / "label_party").mkdir(parents=True)
    (root / "attacker").mkdir()
    header = f"# resolved config; hash abcdef0123456789; seed {SEED}\n# python 3.11\n"
    body = (f'[run]\nname = "synthetic"\nseed = {SEED}\n\n[dataset]\nname = "criteo"\n'
            '[dataset.params]\npath = "/data/criteo/train.txt"\n')
    chain = '\n[[defense]]\nname = "marvell"\ns = 4.0\n'
    run.config.write_text(header + (body + chain if defense else "defense = []\n" + body))
    records: list[dict[str, Any]] = [{"type": "plan", "total_train_steps": STEPS + 1,
                                      "num_classes": 3 if multiclass else 2}]
    for step in range(STEPS + 1):
        record: dict[str, Any] = {"type": "train", "epoch": step // 11, "step": step,
                                  "loss": 0.7 - 0.01 * step}
        if defense:
            record["defense.1"] = {"marvell.auc_bound": 0.7 if step % 2 else 0.75, "marvell.sumkl_after": 0.2}
        records.append(record)
        if evals and step % 5 == 4:
            metric = {"test_accuracy": 0.5 + 0.01 * step} if multiclass else {"test_auc": 0.6 + 0.01 * step}
            records.append({"type": "eval", "epoch": step // 11, "step": step + 1, "test_loss": 0.5,
                            **metric})
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    if defense:
        instance = {"position": 0, "name": "marvell", "batches": STEPS + 1, "passthrough": 0,
                    "mean_sumkl_after": 0.2, "max_auc_bound": 0.75}
        run.outcome.write_text(json.dumps({"status": "ok", "defenses": {
            "1": {"chain": ["marvell"], "seed": SEED, "parties": {"1": [instance]}}}}))
    attacks = DEFAULT_MULTICLASS_ATTACKS if multiclass else DEFAULT_ATTACKS
    per_batch = _leak_rows(attacks, ("cut", "first") if first_layer else ("cut",), 3 if multiclass else 2)
    pq.write_table(pa.Table.from_pylist(per_batch, schema=LEAK_SCHEMA), run.attacker / "leak.parquet")
    if row_sample:
        pq.write_table(_sample_rows(), run.attacker / "rows.parquet")
    threat = ThreatConfig.model_validate({"parties": {"1": {"labelled_per_class": 4}}})
    summary = {"run_id": "synthetic-run", "seed": SEED, "num_classes": 3 if multiclass else 2,
               "draws": 5, "threat": threat.model_dump(mode="json"),
               "warnings": ["shard-000003.arrows: truncated tail after 2 complete record(s)"],
               "leak": summarise_leak(per_batch, {"1": threat.describe([1])}) + [COMPLETION],
               "above_bound": above_bound(per_batch, marvell_bounds(MetricsLog.of(records)))}
    return run, summary


COMPLETION = {
    "party_id": 1, "parties": [1], "layer": "bottom", "attack": "model_completion(labelled_per_class=4)",
    "scope": "run", "epoch": None, "side_knowledge": "the party's own bottom model, 4 labelled rows/class",
    "threat": "curious, honest", "metric": "accuracy", "seed": SEED, "draws": 1, "batches": 1,
    "skipped": 0, "degenerate": 0, "accuracy": {"mean": 0.81, "p95": 0.81, "max": 0.81, "n": 1},
    "pooled": {"accuracy": 0.81, "correct": 810, "rows": 1000, "no_prediction": 0},
    "completion": {"train": {"top1": 0.81, "correct": 810, "rows": 1000, "top5": 0.97},
                   "test": {"top1": 0.62, "correct": 124, "rows": 200, "top5": 0.9},
                   "baselines": {"labelled_only": {"train": {"top1": 0.41}, "test": {"top1": 0.4}},
                                 "random_bottom": {"train": {"top1": 0.22}, "test": {"top1": 0.21}}},
                   "labelled": 40, "classes": 10, "steps": 2000, "cpu_seconds": 61.0}}


def _assert_png(path: Path) -> None:
    assert path.exists(), path
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000, path


def test_attacks_that_see_the_scored_label_are_kept_out_of_the_bound_check(tmp_path: Path) -> None:
    """mean/median(centers=oracle) put the scored row's own gradient in its class's center: an
    upper bound that Marvell's Theorem 1 does not cover, so neither the measured-leak column
    nor the above-bound warnings take them, and the section says so."""
    run, summary = make_run(tmp_path / "run")
    oracle = {"mean(centers=oracle)", "median(centers=oracle)"}
    per_batch = pq.read_table(run.attacker / "leak.parquet").to_pylist()
    for row in per_batch:
        if row["attack"] in oracle and row["layer"] == "cut" and row["auc_flipped"] is not None:
            row["auc_raw"] = row["auc_flipped"] = 0.99
    records = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    summary["leak"] = [{**e, "sees_scored_label": True} if e["attack"] in oracle else e
                       for e in summarise_leak(per_batch, {"1": "curious"})]
    summary["above_bound"] = above_bound(per_batch, marvell_bounds(MetricsLog.of(records)), oracle)
    assert {a["attack"] for a in summary["above_bound"]}.isdisjoint(oracle)
    assert {a["attack"] for a in above_bound(per_batch, marvell_bounds(MetricsLog.of(records)))} >= oracle
    write_report(run, summary)
    text = (run.report / "report.md").read_text()
    assert "| 1 | 22 | 0.725 | 0.750 | 0.750 | 0.880 (norm) |" in text  # not 0.990 (mean…)
    assert ("Not compared: mean(centers=oracle), median(centers=oracle), whose score of a row "
            "reads that row's own label") in text


def test_full_report(tmp_path: Path) -> None:
    run, summary = make_run(tmp_path / "run")
    write_report(run, summary)
    text = (run.report / "report.md").read_text()
    assert "# Label-leak report: synthetic-run" in text
    assert f"seed {SEED}" in text and "`abcdef0123456789`" in text
    # the data set the run trained on, and its file (report.md named neither)
    assert f"dataset `criteo` (`/data/criteo/train.txt`); seed {SEED};" in text
    assert "| norm | 0.880 | - | curious | none |" in text  # headline: p95 of 0.50, 0.52, ..., 0.90
    assert "Party 1 (curious, honest), cut layer" in text
    # the headline says once what a label or count attack's figure is (it said both twice,
    # 'label accuracy' and then 'the accuracy pooled over rows')
    headline = next(line for line in text.splitlines() if line.startswith("Party 1 (curious"))
    assert headline.count("label attacks:") == 1 and headline.count("count attacks:") == 1
    assert "label attacks: not a p95 but the label accuracy pooled over rows" in headline
    # cosine oracle at the cut layer: raw mean, p95, max, then flipped mean, p95, max, spread, skipped
    raw, flipped = "0.300 | 0.480 | 0.500", "0.700 | 0.880 | 0.900"
    assert f"| cosine_oracle | 1 clean positive/batch | {raw} | {flipped} | - | 1/22 |" in text
    assert "## Threat model" in text
    assert "| 1 | yes | honest (follows the protocol) | 1, 3, 5 | 4/class |" in text
    # model completion: train and test top-1 / top-5, then both baselines (train / test)
    assert ("| 1 | curious, honest | model_completion(labelled_per_class=4) | 40 | 0.810 | 0.970 | "
            "0.620 | 0.900 | 0.410 / 0.400 | 0.220 / 0.210 |") in text
    # norm's per-batch AUC 0.50 + 0.02 * step (steps 0..20 scored) passes the bound of its batch
    # (0.70 at odd steps, 0.75 at even ones) at steps 12, 14, .., 20 and 13, 15, .., 19
    assert "| 1 | norm | 9/21 | 0.180 | 0.096 |" in text
    assert "most often norm: 9 of 21 batches, by up to 0.180" in text
    assert "single class in batch (all 0): 16" in text
    assert "| test AUC | test loss | train steps |" in text and "| 0.7900 | 0.5000 | 22 |" in text
    assert "1. `marvell`: s=4.0" in text and "max_auc_bound=0.7500" in text
    assert "mean 0.725, p95 0.750" in text  # Theorem-1 bound: 0.75 and 0.70 alternating over 22 batches
    assert "| 1 | 22 | 0.725 | 0.750 | 0.750 | 0.880 (norm) |" in text
    assert "| epoch 0 | epoch 1 |" in text
    assert "truncated tail after 2 complete record(s)" in text
    assert "k random positives per batch (excluded from the metric)" in text
    for name in ("leak_party1_cut.png", "leak_party1_first.png", "norms_party1.png", "cosine_party1.png",
                 "training.png"):
        _assert_png(run.report / name)
        assert f"]({name})" in text


def test_missing_inputs_are_skipped_and_said(tmp_path: Path) -> None:
    run, summary = make_run(tmp_path / "run", multiclass=True, first_layer=False, row_sample=False,
                            evals=False, defense=False)
    run.report.mkdir()
    (run.report / "norms_party1.png").write_bytes(b"left by an earlier report")
    write_report(run, summary)
    text = (run.report / "report.md").read_text()
    assert "no first-layer gradient recorded" in text
    # a multi-class run never has the per-row sample: its absence is no gap to report
    assert "no norm or cosine histograms" not in text
    assert "no eval records" in text
    assert "None: the cut-layer gradients were sent unchanged." in text
    # label accuracy pooled over rows (64 per batch here), then the per-batch mean / p95 / max
    assert "| direct_label | none | 0.700 | 1344 | 0 | 0.700 | 0.880 | 0.900 | 1/22 |" in text
    assert "| count error mean | count error p95 | count error max |" in text
    assert "| batch_label_counts | none | 0.700 | 0.880 | 0.900 | 1/22 |" in text
    assert ("| clustering | minority / best permutation | 0.700 | 1344 | 0 | 0.700 | 0.880 | 0.900 "
            "| 1/22 |") in text
    _assert_png(run.report / "leak_party1_cut.png")
    _assert_png(run.report / "training.png")
    for name in ("leak_party1_first.png", "norms_party1.png", "cosine_party1.png"):
        assert not (run.report / name).exists()
    # the two-class histograms are not tried on it either: no "plot ... failed" warning
    assert not any("norms_party1" in w or "cosine_party1" in w for w in summary["warnings"])
    assert "norms_party1" not in text and "cosine_party1" not in text


def test_report_without_metrics_or_logs(tmp_path: Path) -> None:
    run, summary = make_run(tmp_path / "run", row_sample=False, defense=False)
    run.metrics.unlink()
    (run.attacker / "leak.parquet").unlink()
    write_report(run, summary)
    text = (run.report / "report.md").read_text()
    assert "label_party/metrics.jsonl is missing" in text and "no attacker/leak.parquet" in text
    assert "| norm | 0.880 | - | curious | none |" in text
    assert not list(run.report.glob("*.png"))


def test_report_of_an_empty_metrics_file_says_it_is_empty(tmp_path: Path) -> None:
    """A 0-byte metrics.jsonl was reported as "no label_party/metrics.jsonl": it is there."""
    run, summary = make_run(tmp_path / "run", row_sample=False, defense=False)
    run.metrics.write_text("")
    write_report(run, summary)
    assert "label_party/metrics.jsonl is empty: no utility table" in (run.report / "report.md").read_text()


def test_terminal_table_fits_80_columns(tmp_path: Path) -> None:
    _, summary = make_run(tmp_path / "run", row_sample=False)
    for width in (80, 200):  # at 200 the table takes its natural width: no wrapping needed at 80
        console = Console(width=width, record=True)
        print_leak_table(console, summary)
        lines = console.export_text().splitlines()
        assert max(len(line) for line in lines) <= 80
        leak_rows = lines[:next(i for i, line in enumerate(lines) if "per-batch" in line)]
        assert any("median(centers=hint, hints=5)" in line and "0.880" in line and "≥5/class" in line
                   for line in leak_rows)  # the longest name whole, its side knowledge on its line
        assert sum("cosine_oracle" in line for line in leak_rows) == 2  # cut and first layer
        assert any(line.split() == ["norm", "0.880", "0.700", "1/22", "none"] for line in leak_rows)
        assert any("cut layer, party 1 (curious)" in line for line in leak_rows)
        assert any("first layer, party 1 (curious)" in line for line in leak_rows)
        completion = next(line for line in lines if line.lstrip().startswith("1 curious"))
        assert "0.810 (0.970)" in completion and "0.410/0.400" in completion


def test_comparison_table(tmp_path: Path) -> None:
    run, summary = make_run(tmp_path / "a", row_sample=False)
    other = json.loads(json.dumps(summary))
    for entry in other["leak"]:
        if entry["attack"] == "norm" and entry["scope"] == "run" and entry["layer"] == "cut":
            entry["flipped"]["p95"] = 0.55
    console = Console(width=80, record=True)
    console.print(comparison_table([("no defense", summary, utility(run)),
                                    ("marvell", other, {**utility(run), "test AUC": 0.75})]))
    lines = console.export_text().splitlines()
    text = "\n".join(lines)
    assert max(map(len, lines)) <= 80
    assert "no defense" in text and "marvell" in text and "p95" in text and "flip-corrected" in text
    cut, first = (next(i for i, line in enumerate(lines) if f"{layer} layer" in line)
                  for layer in ("cut", "first"))
    assert cut < first
    assert lines[cut + 1].split() == ["norm", "0.880", "0.550", "(-0.330)"]  # change vs column 1
    assert lines[first + 1].split()[0] == "norm" and "(+0.000)" in lines[first + 1]
    assert any("median(centers=hint, hints=5)" in line for line in lines[cut:first])
    assert "0.7500 (-0.0400)" in text


@pytest.mark.parametrize(("label", "tag"), [
    ("norm", "none"), ("cosine_oracle", "1 clean positive/batch"),
    ("hint_distance(k=3)", "3 positives/batch"), ("hint_inner(k=1)", "1 positive/batch"),
    ("mean(centers=oracle)", "all labels (oracle)"),
    ("median(centers=hint, hints=5)", "≥5 labels/class/batch"), ("direct_label", "none"),
    ("batch_label_counts", "none"), ("clustering", "minority / best permutation"),
])
def test_side_knowledge_tag(label: str, tag: str) -> None:
    sentence = {build_attack(n, p).label: build_attack(n, p).side_knowledge
                for n, p in [*DEFAULT_ATTACKS, *DEFAULT_MULTICLASS_ATTACKS]}[label]
    assert side_knowledge_tag(label, sentence) == tag


def test_the_reports_own_warnings_reach_the_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leak above Marvell's bound and a plot that failed are warned of in summary.json and the
    terminal too, not only in report.md; what the inputs lack stays in report.md."""
    from attacker.analysis.summary import write_summary
    from attacker.report import plots
    from splitleak.artifacts.summary import read_leak_summary

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no backend")

    monkeypatch.setattr(plots, "training_curves", broken)
    run, summary = make_run(tmp_path / "run", row_sample=False)
    write_report(run, summary)
    write_report(run, summary)  # written again: each warning once
    write_summary(run, summary)
    warnings = read_leak_summary(run).warnings
    assert sum("exceeds Marvell's Theorem-1 bound" in w for w in warnings) == 1
    assert warnings.count("plot training.png failed: RuntimeError: no backend") == 1
    assert not any("rows.parquet" in w for w in warnings)
    assert "no norm or cosine histograms" in (run.report / "report.md").read_text()


def test_utility_from_few_test_rows_is_warned_of() -> None:
    """`max_rows = 10` printed 'test AUC 1.0000' from 2 test rows as an ordinary figure."""
    from attacker.report.report import few_test_rows

    records = [{"type": "eval", "step": 0, "test_rows": 200},
               {"type": "train", "step": 1}, {"type": "eval", "step": 2, "test_rows": 2}]
    assert few_test_rows(MetricsLog.of(records)) == [
        "the utility figures come from 2 test row(s) (the final evaluation's): one row moves the "
        "test accuracy by 0.5; give the run more rows or a larger dataset.test_fraction"]
    assert few_test_rows(MetricsLog.of(records[:1])) == [] and few_test_rows(MetricsLog.of([])) == []


def test_another_run_level_attacks_failure_is_not_listed_under_model_completion() -> None:
    """EXACT's and the backdoor's skip reasons were printed inside the model-completion table
    and listed under report.md's '## Model completion'."""
    from attacker.report.cells import run_entries
    from attacker.report.threat import completion_md

    base = {"scope": "run", "layer": "bottom", "party_id": 1, "parties": [1], "seed": 0}
    summary = {"leak": [
        {**base, "attack": "exact", "name": "exact", "error": "EXACT runs for one party declared "
                                                              "white_box"},
        {**base, "attack": "model_completion", "name": "model_completion",
         "error": "labelled_per_class = 1000 labels every one of the 240 train rows"}]}
    assert [e["name"] for e in run_entries(summary, completion=True)] == ["model_completion"]
    assert run_entries(summary) == []
    text = "\n".join(completion_md(summary))
    assert "labelled_per_class = 1000" in text and "white_box" not in text


def test_a_first_layer_the_run_chose_not_to_record_is_no_gap(tmp_path: Path) -> None:
    """Every sweep that sets attacker.record_first_layer = false on purpose was told 'no
    first-layer gradient recorded' for each party."""
    run, summary = make_run(tmp_path / "run", first_layer=False)
    run.config.write_text(run.config.read_text() + "\n[attacker]\nrecord_first_layer = false\n")
    write_report(run, summary)
    assert "no first-layer gradient recorded" not in (run.report / "report.md").read_text()


def test_the_completion_tables_caption_says_what_the_brackets_hold() -> None:
    """The caption read 'train rows exclude the labelled ones; (top-5); baselines ...', on a
    binary run whose cells have no top-5 at all."""
    from attacker.report.terminal import completion_table

    entry = {"scope": "run", "party_id": 1, "layer": "bottom", "attack": "model_completion",
             "name": "model_completion", "threat": "curious, honest",
             "completion": {"labelled": 8, "train": {"top1": 0.644}, "test": {"top1": 0.711}}}
    console = Console(width=200, record=True)
    console.print(completion_table({"leak": [entry]}))
    text = " ".join(console.export_text().split())
    assert "(top-5) beside top-1 for ten or more classes" in text and "; (top-5);" not in text
