"""Numbers comparable with the literature, compare side (issue 25): DCS from VFLAIR's attack
performance (the AUC-based one a named variant), attacks whose premise failed left out, intervals
clipped to the metric's range, warnings, the verdicts, diagnostics last, and a terminal table
that fits any width."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from attacker.analysis.analyze import default_attacks
from attacker.attacks import build_attack
from attacker.report.threat import completion_md
from orchestration.cli import main
from orchestration.compare.command import summary_table, verdict_lines
from orchestration.compare.dcs import dcs
from orchestration.compare.read import find_runs
from orchestration.compare.report import write_report
from orchestration.compare.stats import over_seeds
from orchestration.compare.table import compare
from tests.conftest import small_config
from tests.test_compare import declared, fake_run, leak_entry

NORM_RULE = "positive where the min-max normalised score is > 0.5"


def _sweep(root: Path, settings: dict[str, tuple[list[dict], list[float], float]],
           attacks: list[str], extra: list[dict[str, Any]] | None = None,
           num_classes: int = 2) -> Path:
    """Fake analysed runs: per setting (chain, utility per seed, leak), every attack's entry with
    an AUC mean of leak + 0.01·seed (threshold accuracy: that − 0.1) and `extra` entries."""
    for name, (chain, utilities, leak) in settings.items():
        slug = name.replace(" ", "_").replace("=", "")
        for seed, utility in enumerate(utilities):
            data = small_config(root, run={"seed": seed, "name": slug}, defense=chain)
            entries = [leak_entry(a, leak + 0.01 * seed, min(leak + 0.05, 1.0)) for a in attacks]
            fake_run(root / "runs" / f"{slug}-{seed}", data, utility, [*entries, *(extra or [])],
                     num_classes)
    return root / "runs"


LI = {"no defense": ([], [0.95, 0.96, 0.97], 0.90),
      "marvell s=4": ([{"name": "marvell", "s": 4.0}], [0.945, 0.955, 0.965], 0.60),
      "max_norm": ([{"name": "max_norm"}], [0.949, 0.959, 0.969], 0.70),
      "iso t=1": ([{"name": "iso", "t": 1.0}], [0.90, 0.91, 0.92], 0.55)}


# --- 1. DCS from VFLAIR's attack performance ---------------------------------------------------


def test_dcs_defaults_to_vflairs_attack_performance_and_keeps_the_auc_variant(tmp_path: Path) -> None:
    runs, _ = find_runs([_sweep(tmp_path, LI, ["norm", "cosine_oracle"])])
    vflair, auc = compare(runs), compare(runs, dcs_ap="auc")
    row = next(r for r in vflair.rows if r["setting"] == "marvell s=4" and r["attack"] == "norm")
    aps, mps, stars = [0.50, 0.51, 0.52], [0.945, 0.955, 0.965], [0.95, 0.96, 0.97]
    assert row["ap_mean"] == pytest.approx(0.51) and row["dcs_ap"] == "vflair"
    assert row["dcs_mean"] == pytest.approx(np.mean([dcs(a, m, s) for a, m, s in zip(aps, mps, stars,
                                                                                     strict=True)]))
    assert row["t_dcs_mean"] == pytest.approx(row["dcs_mean"]) == pytest.approx(row["c_dcs_mean"])
    old = next(r for r in auc.rows if r["setting"] == "marvell s=4" and r["attack"] == "norm")
    assert old["dcs_mean"] == pytest.approx(np.mean([dcs(a + 0.1, m, s) for a, m, s in zip(
        aps, mps, stars, strict=True)]))  # the flip-corrected mean AUC
    assert old["c_dcs_mean"] == pytest.approx(old["dcs_mean"])
    text = write_report(vflair, tmp_path / "out", [tmp_path]).read_text()
    assert "VFLAIR's attack performance: score attacks by the accuracy of their threshold rule" in text
    assert "VFLAIR scores one stored batch" in text and f"- {NORM_RULE}: `norm`, `cosine_oracle`" in text


# --- 2. an attack whose premise fails is left out ------------------------------------------------


def test_an_attack_whose_premise_failed_is_left_out_of_t_dcs(tmp_path: Path) -> None:
    direct = {"scope": "run", "party_id": 1, "layer": "cut", "attack": "direct_label",
              "metric": "accuracy", "side_knowledge": "none", "batches": 10, "skipped": 10,
              "accuracy": {"mean": None, "p95": None, "max": None}, "pooled": {"accuracy": None},
              "premise": "needs the gradient of the logits (VFL without a top model)"}
    settings = {k: v for k, v in LI.items() if k in ("no defense", "marvell s=4")}
    runs, _ = find_runs([_sweep(tmp_path, settings, ["norm"], [direct])])
    comparison = compare(runs)
    assert comparison.attacks() == ["norm"]
    assert comparison.not_applied == {"direct_label": direct["premise"]}
    assert any(w.startswith("direct_label: not scored, its premise fails") for w in comparison.warnings)
    row = next(r for r in comparison.rows if r["setting"] == "marvell s=4")
    assert row["c_dcs_mean"] == pytest.approx(row["dcs_mean"])  # norm alone


# --- 6. intervals in range, warnings, verdicts ---------------------------------------------------


def test_intervals_are_clipped_to_the_metrics_range() -> None:
    auc = over_seeds([0.99, 1.0], True, (0.0, 1.0))
    assert auc.ci_high == 1.0 and auc.ci_clipped == "high" and auc.ci_low < 0.99
    raw = over_seeds([0.99, 1.0], True)
    assert raw.ci_high > 1.0 and raw.ci_clipped == ""  # t(0.975, 1) = 12.7: up to 1.07
    time = over_seeds([1.0, 9.0], False, (0.0, math.inf))
    assert time.ci_low == 0.0 and time.ci_clipped == "low"
    both = over_seeds([0.0, 1.0], True, (0.0, 1.0))
    assert (both.ci_low, both.ci_high, both.ci_clipped) == (0.0, 1.0, "both")


def test_two_seeds_near_chance_warn_and_clipped_ends_are_marked(tmp_path: Path) -> None:
    settings = {"no defense": ([], [0.51, 0.56], 0.97), "iso t=1": ([{"name": "iso", "t": 1.0}],
                                                                    [0.50, 0.53], 0.60)}
    runs, _ = find_runs([_sweep(tmp_path, settings, ["norm"])])
    comparison = compare(runs)
    row = next(r for r in comparison.rows if r["setting"] == "no defense")
    # flipped means 0.97 and 0.98: the t interval 0.975 ± 0.064 is cut at 1
    assert row["leak_flipped_mean_ci_high"] == 1.0 and row["leak_flipped_mean_ci_clipped"] == "high"
    assert row["leak_ci_clipped"] == ""  # p95 1.0 on both seeds: a zero-width interval, not cut
    warnings = "\n".join(comparison.warnings)
    assert "no defense: 2 seed(s)" in warnings and "iso t=1: 2 seed(s)" in warnings
    assert "no defense: its test AUC 0.535 [0.217, 0.853] is within its interval of chance (0.500)" \
        in warnings
    text = write_report(comparison, tmp_path / "out", [tmp_path]).read_text()
    assert "1.000†]" in text and "† = the t interval reached beyond the metric's range" in text


def test_the_report_opens_with_a_verdict_per_attack(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs_dir = _sweep(tmp_path, LI, ["norm"])
    runs, _ = find_runs([runs_dir])
    verdict = compare(runs).verdicts()[0]
    # iso leaks least but costs 0.05; marvell costs 0.005: the lowest leak within 0.01
    assert verdict.best["setting"] == "marvell s=4" and verdict.baseline["setting"] == "no defense"
    assert verdict.sentence() == ("norm: marvell s=4, leak 0.650 (no defense 0.950) at a utility "
                                  "cost of 0.005")
    generous = compare(runs, max_utility_cost=0.06).verdicts()[0]
    assert generous.best["setting"] == "iso t=1"
    strict = compare(runs, max_utility_cost=0.0).verdicts()[0]
    assert not strict.defended and "no defense; none on the frontier" in strict.sentence()

    assert main(["compare", str(runs_dir), "--output-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "verdict" in out and "norm: marvell s=4, leak 0.650" in out and "C-DCS" in out
    text = (tmp_path / "out" / "report.md").read_text()
    assert text.startswith("# Trade-off report\n\n## Verdict") and text.index("## norm") > 0
    assert main(["compare", str(runs_dir), "--output-dir", str(tmp_path / "out"),
                 "--max-utility-cost", "0.06"]) == 0
    assert "norm: iso t=1" in capsys.readouterr().out


# --- 7. KD^k: fine-tuned completion leads, frozen is a diagnostic --------------------------------


FROZEN = "model_completion(labelled_per_class=4, fine_tune_bottom=False)"
WHY = "the bottom frozen measures the label information training put into it"


def _completion(attack: str, accuracy: float, diagnostic: str | None = None) -> dict[str, Any]:
    entry = {"scope": "run", "party_id": 1, "parties": [1], "layer": "bottom", "attack": attack,
             "metric": "accuracy", "side_knowledge": "own bottom", "batches": 1, "skipped": 0,
             "accuracy": {"mean": accuracy, "p95": accuracy, "max": accuracy},
             "pooled": {"accuracy": accuracy}, "threat": "curious, honest", "seed": 0,
             **declared("model_completion"),
             "completion": {"labelled": 40, "train": {"top1": accuracy}, "test": {"top1": accuracy}}}
    return {**entry, "diagnostic": diagnostic} if diagnostic else entry


def test_fine_tuned_completion_leads_and_frozen_is_a_diagnostic(tmp_path: Path) -> None:
    assert build_attack("model_completion", {}).diagnostic is None
    assert WHY in build_attack("model_completion", {"fine_tune_bottom": False}).diagnostic
    for name, accuracy in (("none", 0.96), ("kdk", 0.90)):
        frozen = 0.80 if name == "none" else 0.64
        tuned = 0.81 if name == "none" else 0.79
        objective = {"name": "kdk"} if name == "kdk" else {"name": "cross_entropy"}
        for seed in (0, 1, 2):
            data = small_config(tmp_path, run={"seed": seed, "name": name}, objective=objective)
            fake_run(tmp_path / "runs" / f"{name}-{seed}", data, accuracy,
                     [_completion(FROZEN, frozen, WHY), _completion("model_completion(labelled_per_class=4)",
                                                                   tuned)], num_classes=10)
    runs, _ = find_runs([tmp_path / "runs"])
    comparison = compare(runs, layer="bottom")
    assert comparison.attacks() == ["model_completion(labelled_per_class=4)", FROZEN]
    kdk = {r["attack"]: r for r in comparison.rows if r["family"] == "kdk"}
    assert kdk[FROZEN]["t_dcs_mean"] is None and kdk[FROZEN]["dcs_mean"] is not None
    assert kdk["model_completion(labelled_per_class=4)"]["c_dcs_mean"] == pytest.approx(
        kdk["model_completion(labelled_per_class=4)"]["dcs_mean"])  # frozen left out
    assert [v.attack for v in comparison.verdicts()] == ["model_completion(labelled_per_class=4)"]
    text = write_report(comparison, tmp_path / "out", [tmp_path]).read_text()
    assert text.index("## model_completion(labelled_per_class=4)\n") < text.index(f"## {FROZEN} (diagnostic)")
    assert "**Diagnostic**, not the figure to set beside the papers'" in text

    summary = {"leak": [_completion(FROZEN, 0.64, WHY), _completion("model_completion(labelled_per_class=4)",
                                                                   0.79)]}
    lines = [line for line in completion_md(summary) if line.startswith("| 1 |")]
    assert "fine_tune_bottom" not in lines[0] and lines[0].endswith("| comparable |")
    assert FROZEN in lines[1] and lines[1].endswith("| diagnostic |")


# --- 8. the terminal table fits any width ----------------------------------------------------


@pytest.mark.parametrize("width", [80, 60])
def test_the_terminal_table_fits_when_piped(tmp_path: Path, width: int) -> None:
    attacks = [build_attack(n, p).label for n, p in default_attacks(2)]
    assert len(attacks) == 16
    runs, _ = find_runs([_sweep(tmp_path, LI, attacks)])
    comparison = compare(runs)
    out = io.StringIO()
    console = Console(file=out, width=width)  # not a terminal, as when piped to a file
    assert not console.is_terminal
    console.print(summary_table(comparison, console.width))
    text = out.getvalue()
    assert max(map(len, text.splitlines())) <= width
    flat = " ".join(text.split())
    for i, attack in enumerate(attacks, start=1):
        assert f"A{i} = {attack}" in flat, attack  # every legend entry
        assert any(line.split()[:1] == ["setting"] and f"A{i}" in line.split()
                   for line in text.splitlines()), i  # every attack column
    assert flat.count("0.650*") == 16  # marvell's leak in every attack's column
    verdicts = io.StringIO()
    Console(file=verdicts, width=width).print(verdict_lines(comparison))
    assert max(map(len, verdicts.getvalue().splitlines())) <= width
    assert " ".join(verdicts.getvalue().split()).count(": marvell s=4, leak 0.650") == 16


def test_compare_on_li_tradeoffs_sweep_prints_vflairs_dcs_and_the_verdicts(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """examples/sweeps/li_tradeoff.toml's 27 points, each a fake analysed run (norm and cosine
    oracle): the terminal has the C-DCS column and a verdict per attack; report.md opens with
    them and states VFLAIR's attack performance."""
    from orchestration.sweep.index import SweepIndex
    from orchestration.sweep.points import resolve
    from orchestration.sweep.spec import load_sweep
    from splitleak.config import load_config

    sweep = load_sweep(Path(__file__).parent.parent / "examples" / "sweeps" / "li_tradeoff.toml")
    sweep_dir = tmp_path / "li_tradeoff"
    points = resolve(sweep, load_config(None), sweep_dir)
    index = SweepIndex(sweep_dir, points, "local")
    assert len(points) == 27
    for point in points:
        chain = point.config.defense
        strength = chain[0].params.get("s", chain[0].params.get("t", 1.0)) if chain else 0.0
        name = chain[0].name if chain else "none"
        norm = {"none": 0.92, "max_norm": 0.55, "iso": 0.90 - 0.02 * strength}.get(
            name, 0.92 - 0.08 * strength)
        cosine = {"none": 1.0, "max_norm": 0.97, "iso": 0.99}.get(name, 1.0 - 0.1 * strength)
        cost = {"none": 0.0, "max_norm": 0.004, "iso": 0.01 * strength}.get(name, 0.002 * strength)
        utility = 0.75 - cost + 0.002 * point.seed
        fake_run(point.run_dir, point.config.model_dump(mode="json"), utility,
                 [leak_entry("norm", norm, norm + 0.03), leak_entry("cosine_oracle", cosine, cosine)])
        index.mark(point, "done", 1.0)
    assert main(["compare", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert "C-DCS" in out and "verdict" in out
    assert "norm: max_norm, leak 0.580" in " ".join(out.split())  # marvell s=4 costs 0.008 for 0.61
    assert "cosine_oracle: marvell, defense.0.s=4.0, leak 0.600" in " ".join(out.split())
    text = (sweep_dir / "compare" / "report.md").read_text()
    assert text.startswith("# Trade-off report\n\n## Verdict")
    assert "AP (vflair, `--dcs-ap`) = VFLAIR's attack performance" in text



# --- issue 27: VFLAIR's families ------------------------------------------------------------------


def test_t_dcs_groups_attacks_by_their_vflair_family_and_says_which_c_dcs_covers(
        tmp_path: Path) -> None:
    """Each entry's family and AP come from its plug-in (summary.json): T-DCS is per family,
    C-DCS the mean over the families present, and the report names the families it lacks."""
    backdoor = {"scope": "run", "party_id": 1, "layer": "output", "attack": "replacement_backdoor",
                "name": "replacement_backdoor", "metric": "asr", "side_knowledge": "x",
                "family": "targeted_backdoor", "vflair": "LRB", "ap": {"value": 0.8},
                "integrity": {"metric": "asr", "value": 0.8, "ap": 0.8}}
    settings = {"no defense": ([], [0.95, 0.96, 0.97], 0.90),
                "marvell s=4": ([{"name": "marvell", "s": 4.0}], [0.945, 0.955, 0.965], 0.60)}
    runs, _ = find_runs([_sweep(tmp_path, settings, ["norm"], extra=[backdoor])])
    for run in runs:  # the plug-ins' families, as a current analysis writes them
        for e in run.leak:
            assert e.attack_type in ("label inference", "targeted backdoor")
    comparison = compare(runs)  # the cut layer's tables; DCS over every family's layer
    assert {r["attack"] for r in comparison.rows} == {"norm"}
    rows = {r["attack"]: r for r in comparison.capability if r["setting"] == "marvell s=4"}
    assert rows["replacement_backdoor"]["attack_type"] == "targeted backdoor"
    assert rows["replacement_backdoor"]["layer"] == "output"
    assert rows["replacement_backdoor"]["ap_mean"] == pytest.approx(0.8)  # the plug-in's AP
    li, tb = rows["norm"]["t_dcs_mean"], rows["replacement_backdoor"]["t_dcs_mean"]
    assert rows["norm"]["c_dcs_mean"] == pytest.approx((li + tb) / 2)
    text = write_report(comparison, tmp_path / "out", [tmp_path]).read_text()
    assert "T-DCS label inference" in text and "T-DCS targeted backdoor" in text
    assert ("here over label inference, targeted backdoor (no feature reconstruction, "
            "non-targeted attack of VFLAIR's in these runs") in text


def test_t_dcs_averages_over_vflairs_attacks_only(tmp_path: Path) -> None:
    """A label-inference family with VFLAIR's `norm` (NS) beside splitleak's `clustering` (no
    VFLAIR counterpart): T-DCS LI, C-DCS and ours are `norm`'s DCS alone, as VFLAIR's own table
    (and examples/vflair/tdcs.py) computes them; `clustering` keeps its DCS, listed by name."""
    settings = {"no defense": ([], [0.95, 0.96, 0.97], 0.90),
                "marvell s=4": ([{"name": "marvell", "s": 4.0}], [0.945, 0.955, 0.965], 0.60)}
    clustering = leak_entry("clustering", 0.99, 0.99)  # AP 0.89 beside norm's 0.50-0.52
    runs, _ = find_runs([_sweep(tmp_path, settings, ["norm"], extra=[clustering])])
    comparison = compare(runs)
    for rows in (comparison.rows, comparison.capability):
        own = {r["attack"]: r for r in rows if r["setting"] == "marvell s=4"}
        norm, clustering = own["norm"], own["clustering"]
        assert clustering["dcs_mean"] is not None and clustering["dcs_mean"] != norm["dcs_mean"]
        assert norm["t_dcs_mean"] == pytest.approx(norm["dcs_mean"]) == pytest.approx(norm["c_dcs_mean"])
        assert norm["vflair"] == "NS" and clustering["vflair"] is None
        assert norm["t_dcs_of_means"] == pytest.approx(norm["dcs_of_means"])
        assert norm["t_dcs_ours_mean"] == pytest.approx(norm["dcs_ours_mean"])
        assert clustering["t_dcs_mean"] is None and clustering["c_dcs_mean"] is None
    text = write_report(comparison, tmp_path / "out", [tmp_path]).read_text()
    assert ("Left out of T-DCS and C-DCS, as their entries name no VFLAIR counterpart (their DCS "
            "is in their own section): `clustering` (label inference).") in text
    assert "**Not VFLAIR's**: its entries name no VFLAIR counterpart" in text
    assert "*Ours*: the same attacks and families" in text


def test_a_family_of_attacks_vflair_lacks_has_no_t_dcs(tmp_path: Path) -> None:
    """Only `clustering` in label inference: no T-DCS, no C-DCS (not 0, not NaN), and the report
    says why; an entry from a summary that predates VFLAIR's names is left out with a warning."""
    settings = {"no defense": ([], [0.95, 0.96, 0.97], 0.90),
                "marvell s=4": ([{"name": "marvell", "s": 4.0}], [0.945, 0.955, 0.965], 0.60)}
    old = {k: v for k, v in leak_entry("norm", 0.8, 0.9).items() if k not in ("family", "vflair")}
    runs, _ = find_runs([_sweep(tmp_path, settings, ["clustering"], extra=[old])])
    comparison = compare(runs)
    row = next(r for r in comparison.capability
               if r["setting"] == "marvell s=4" and r["attack"] == "clustering")
    assert row["dcs_mean"] is not None and row["t_dcs_mean"] is None and row["c_dcs_mean"] is None
    assert any(w.startswith("norm: these runs' summaries do not say whether VFLAIR has this attack")
               for w in comparison.warnings)
    text = write_report(comparison, tmp_path / "out", [tmp_path]).read_text()
    assert ("- marvell s=4: no T-DCS label inference, the only label inference attacks "
            "(`clustering`, `norm`) name no VFLAIR counterpart") in text
    assert "| marvell s=4 | – | – | – |" in text and "here over no family" in text


def test_a_completion_figures_interval_is_clipped_to_an_accuracys_range(tmp_path: Path) -> None:
    """Model completion's test top-1 over seeds 0.70, 0.99, 0.96 read 0.883 [0.487, 1.279] in
    report.md: an accuracy's t interval past 1, unclipped and unmarked."""
    for seed, test in zip((0, 1, 2), (0.70, 0.99, 0.96), strict=True):
        entry = _completion("model_completion(labelled_per_class=4)", 0.8)
        entry["completion"]["test"]["top1"] = test
        fake_run(tmp_path / "runs" / f"none-{seed}",
                 small_config(tmp_path, run={"seed": seed, "name": "none"}), 0.9, [entry],
                 num_classes=10)
    runs, _ = find_runs([tmp_path / "runs"])
    comparison = compare(runs, layer="bottom")
    test = json.loads(comparison.rows[0]["figures"])["test"]
    assert test["value_ci_high"] == 1.0 and test["value_ci_clipped"] == "high"
    text = write_report(comparison, tmp_path / "out", [tmp_path]).read_text()
    assert "0.883 [0.487, 1.000†]" in text
