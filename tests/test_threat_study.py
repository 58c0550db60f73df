"""examples/threat/sweep.toml, the threat study as one sweep (once a table script and 18 run
files): every defense × honest / malicious party 1 × seeds, and the figures its
table needs from `splitleak compare`: each setting against its own no-defense setting, the
per-seed changes, the completion's test split and baselines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestration.compare.read import find_runs
from orchestration.compare.report import write_report
from orchestration.compare.table import compare
from orchestration.sweep.index import SweepIndex
from orchestration.sweep.points import Point, resolve
from orchestration.sweep.spec import base_path, load_sweep
from splitleak.config import load_config
from tests.test_compare import fake_run, leak_entry

SWEEP = Path(__file__).parent.parent / "examples" / "threat" / "sweep.toml"
TUNED = "model_completion(labelled_per_class=4)"
FROZEN = "model_completion(labelled_per_class=4, fine_tune_bottom=False)"
OPTIMIZER = "threat.parties.1.optimizer"
DEFENSES = ["none", "kdk", "laplace", "sparsify", "discrete_sgd", "ppdl", "label_dp", "none_binary",
            "marvell"]


@pytest.fixture(scope="module")
def points(tmp_path_factory: pytest.TempPathFactory) -> list[Point]:
    """Resolved without the datasets' checks (tests/test_examples.py runs those)."""
    sweep = load_sweep(SWEEP)
    return resolve(sweep, load_config(base_path(sweep, SWEEP)), tmp_path_factory.mktemp("t") / "threat")


def test_every_defense_against_an_honest_and_a_malicious_party_1_over_three_seeds(points) -> None:
    assert len(points) == 9 * 2 * 3
    assert list(dict.fromkeys(p.variant for p in points)) == DEFENSES
    assert {(dict(p.setting_axes)[OPTIMIZER], p.seed) for p in points} == {
        (o, s) for o in ("honest", "malicious") for s in (0, 1, 2)}
    for point in points:
        cfg = point.config
        binary = point.variant in ("none_binary", "marvell")
        assert cfg.dataset.name == ("mnist_5k_binary" if binary else "mnist_5k")
        assert cfg.threat.parties["1"].optimizer == dict(point.setting_axes)[OPTIMIZER]
        attacks = [(a.name, a.params) for a in cfg.attacker.attacks]
        baselines = point.variant in ("none", "none_binary")  # only the no-defense runs train them
        assert attacks[:2] == [
            ("model_completion", {"labelled_per_class": 4, "baselines": baselines}),
            ("model_completion", {"labelled_per_class": 4, "fine_tune_bottom": False,
                                  "baselines": False})]
        assert [a for a, _ in attacks[2:]] == ["clustering", *(["norm"] if binary else [])]
    defended = {p.variant: p.config for p in points if p.seed == 0}
    assert defended["kdk"].objective.params["epsilon"] == 0.45
    assert defended["marvell"].defense[0].params == {"s": 4.0}
    assert defended["label_dp"].objective.name == "label_dp"


def _completion(attack: str, train: float, test: float, baselines: bool,
                diagnostic: str | None = None) -> dict[str, Any]:
    figures: dict[str, Any] = {"train": {"top1": train}, "test": {"top1": test}}
    if baselines:
        figures["baselines"] = {"labelled_only": {"train": {"top1": 0.7}, "test": {"top1": 0.72}},
                                "random_bottom": {"train": {"top1": 0.77}, "test": {"top1": 0.76}}}
    entry = {"scope": "run", "party_id": 1, "parties": [1], "layer": "bottom", "attack": attack,
             "metric": "accuracy", "side_knowledge": "own bottom", "accuracy": {"mean": train},
             "pooled": {"accuracy": train}, "completion": figures}
    return {**entry, "diagnostic": diagnostic} if diagnostic else entry


# completion (train, test) per seed of the honest runs; the malicious ones are 0.02 higher
TRAIN = {"none": (0.80, 0.82, 0.84), "kdk": (0.60, 0.82, 0.63), "none_binary": (0.60, 0.60, 0.60),
         "marvell": (0.54, 0.57, 0.60)}
UTILITY = {"none": 0.96, "kdk": 0.90, "none_binary": 0.99, "marvell": 0.98}


@pytest.fixture(scope="module")
def threat_sweep(points: list[Point]) -> Path:
    """Fake analysed runs of every point; completion as TRAIN (test: 0.01 lower)."""
    sweep_dir = points[0].run_dir.parent
    index = SweepIndex(sweep_dir, points, "inprocess")
    for point in points:
        active = 0.02 if dict(point.setting_axes)[OPTIMIZER] == "malicious" else 0.0
        train = TRAIN.get(point.variant, (0.78, 0.80, 0.82))[point.seed] + active
        baselines = point.variant in ("none", "none_binary")
        leak = [_completion(TUNED, train, train - 0.01, baselines),
                _completion(FROZEN, train - 0.1, train - 0.11, False, "a diagnostic"),
                leak_entry("clustering", 0.75, 0.8)]
        fake_run(point.run_dir, point.config.model_dump(mode="json"),
                 UTILITY.get(point.variant, 0.95) + 0.001 * point.seed, leak,
                 num_classes=2 if point.variant in ("none_binary", "marvell") else 10)
        index.mark(point, "done", 1.0)
    return sweep_dir


def test_each_setting_is_compared_with_its_own_no_defense_setting(threat_sweep: Path) -> None:
    runs, warnings = find_runs([threat_sweep])
    assert len(runs) == 54 and not warnings
    rows = {r["setting"]: r for r in compare(runs, layer="bottom").rows if r["attack"] == TUNED}
    for defense in DEFENSES:
        for optimizer in ("honest", "malicious"):
            own = f"{OPTIMIZER}={optimizer}"
            reference = "none_binary" if defense in ("none_binary", "marvell") else "none"
            assert rows[f"{defense}, {own}"]["baseline"] == f"{reference}, {own}", defense


def test_the_tables_figures_over_seeds_with_each_seeds_change(threat_sweep: Path, tmp_path: Path) -> None:
    """What the study's table needs, from compare: utility and its drop in points,
    completion train (the headline) and test with the mean per-seed relative change against the
    same seed's no-defense run, and the no-defense settings' baselines."""
    runs, _ = find_runs([threat_sweep])
    comparison = compare(runs, layer="bottom")
    rows = {(r["setting"], r["attack"]): r for r in comparison.rows}
    kdk = rows[(f"kdk, {OPTIMIZER}=honest", TUNED)]
    assert kdk["n_seeds"] == 3 and kdk["utility_drop_mean"] == pytest.approx(0.06)
    assert kdk["leak_mean"] == pytest.approx((0.60 + 0.82 + 0.63) / 3)
    changes = [(k - n) / n for k, n in zip(TRAIN["kdk"], TRAIN["none"], strict=True)]
    assert kdk["leak_change_mean"] == pytest.approx(sum(changes) / 3)  # -25 %, 0 %, -25 %
    figures = json.loads(kdk["figures"])
    assert set(figures) == {"test"}
    assert figures["test"]["value_mean"] == pytest.approx(kdk["leak_mean"] - 0.01)
    test_changes = [(k - n) / (n - 0.01) for k, n in zip(TRAIN["kdk"], TRAIN["none"], strict=True)]
    assert figures["test"]["change_mean"] == pytest.approx(sum(test_changes) / 3)
    active = rows[(f"marvell, {OPTIMIZER}=malicious", TUNED)]  # against none_binary, malicious
    assert active["leak_change_mean"] == pytest.approx(
        sum((m - 0.62) / 0.62 for m in (0.56, 0.59, 0.62)) / 3)
    none = json.loads(rows[(f"none, {OPTIMIZER}=honest", TUNED)]["figures"])
    assert none["labelled_only train"]["value_mean"] == pytest.approx(0.7)
    assert none["random_bottom test"]["value_mean"] == pytest.approx(0.76)
    assert none["labelled_only test"]["change_mean"] == 0.0  # its own baseline
    assert rows[(f"kdk, {OPTIMIZER}=honest", FROZEN)]["diagnostic"] == "a diagnostic"
    text = write_report(comparison, tmp_path / "out", [threat_sweep]).read_text()
    section = text[text.index(f"## {TUNED}\n"):text.index(f"## {FROZEN}")]
    assert "| setting | test | labelled_only train |" in section
    assert f"| kdk, {OPTIMIZER}=honest | 2 |" not in section  # three seeds each
    assert "(-17% [" in section  # kdk's test change, -26 % / 0 % / -26 % over the seeds
