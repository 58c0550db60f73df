"""Integrity attacks of a malicious passive party (ALGORITHMS.md §2.16-2.18): the threat model's
settings, the party's triggered / noisy / missing rows and its swap by hand, the scores by hand,
runs where they must succeed without a defense and fail under MID, and one run over the wire."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from attacker.analysis.analyze import analyze
from attacker.attacks.integrity.base import VariantPass
from attacker.attacks.integrity.missing_features import mixed_accuracy
from attacker.attacks.integrity.replacement_backdoor import success_rates
from label_party.schedule import Phase, make_plan, schedule
from passive_party.bottom_trainer import BottomTrainer
from passive_party.integrity import PartyIntegrity, Swap
from splitleak.artifacts.paths import RunDir
from splitleak.config import ConfigError, parse_config
from splitleak.inputs import PartyInputs
from splitleak.integrity import variant_rows
from splitleak.models import Bottom, InputSpec
from splitleak.validation import check_core
from tests.conftest import small_config
from tests.runs import reference_run

ALL_THREE = {"backdoor": {"target_class": 0, "known_targets": 100, "poison_fraction": 0.05,
                          "trigger_value": 100.0},
             "noisy_samples": {"noise_lambda": 2.0, "noise_rate": 0.05},
             "missing_features": {"missing_rate": 0.25}}


def _config(tmp_path: Path, party: dict | None = None, **overrides: object) -> dict:
    """digits halves, VFLAIR's MNIST model (sum of the parties' logits); party 1 attacks."""
    data = small_config(
        tmp_path, dataset={"name": "digits", "test_fraction": 0.2},
        features={"passive": [[0, 4]], "label_party": [4, 8]},
        model={"kind": "mlp", "layers": [32], "cut_layer": 1, "top": "none", "aggregation": "sum"},
        training={"batch_size": 64, "epochs": 20, "eval_interval": 0},
        topology={"passive_parties": 1, "tls": False},
        threat={"parties": {"1": {"curious": False, **(ALL_THREE if party is None else party)}}})
    data.update(overrides)
    return data


# --- the threat model --------------------------------------------------------------------


def test_settings_are_validated_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"threat.parties.1.backdoor.poison_fraction"):
        parse_config(_config(tmp_path, {"backdoor": {"poison_fraction": 0}}))
    both = _config(tmp_path, topology={"passive_parties": 2, "tls": False},
                   features={"passive": [[0, 2], [2, 4]], "label_party": [4, 8]})
    both["threat"] = {"parties": {"1": {"noisy_samples": {}}, "2": {"noisy_samples": {}}}}
    with pytest.raises(ConfigError, match=r"both run the 'noisy' integrity attack"):
        parse_config(both)
    with pytest.raises(ConfigError, match=r"backdoor.target_class = 12, but digits has classes 0..9"):
        check_core(parse_config(_config(tmp_path, {"backdoor": {"target_class": 12}})))
    cfg = parse_config(_config(tmp_path))
    assert "replacement backdoor (target class 0" in cfg.threat.describe([1])
    assert "5% poisoned" in cfg.threat.describe([1])
    # a share under 0.5 % was reported as 0 %: the threat model read "0% poisoned"
    small = parse_config(_config(tmp_path, {"backdoor": {"poison_fraction": 0.004},
                                            "noisy_samples": {"noise_rate": 0.001},
                                            "missing_features": {"missing_rate": 0.125}}))
    described = small.threat.describe([1])
    assert "0.4% poisoned" in described and "0.1% of the test rows" in described, described
    assert "missing features (12.5% of the rows" in described, described
    assert "honest" not in cfg.threat.describe([1])


def test_the_evaluation_scores_each_variant_after_the_clean_rows(tmp_path: Path) -> None:
    cfg = parse_config(_config(tmp_path))
    test_ids = np.arange(100, 200)
    variants = variant_rows(cfg.threat, test_ids, seed=3)
    assert [(v, ids.size) for v, ids in variants] == [("backdoor", 5), ("noisy", 5), ("missing", 25)]
    assert all(np.isin(ids, test_ids).all() for _, ids in variants)
    again = variant_rows(cfg.threat, test_ids, seed=3)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(variants, again, strict=True))
    plan = make_plan(cfg, 300)
    with_variants = list(schedule(plan, np.arange(300), test_ids, 3, variants))
    clean = list(schedule(plan, np.arange(300), test_ids, 3))
    assert [(b.phase, b.step, b.split, b.sample_ids.tolist()) for b in clean] == [
        (b.phase, b.step, b.split, b.sample_ids.tolist()) for b in with_variants if not b.variant]
    first_pass = [b for b in with_variants if b.phase is Phase.EVAL and b.step == plan.steps_per_epoch]
    assert [b.split for b in first_pass] == ["test", "test", "backdoor", "noisy", "missing"]
    assert [b.last_of_eval for b in first_pass] == [False] * 4 + [True]


# --- the attacking party, by hand --------------------------------------------------------


def _party(tmp_path: Path, party: dict, rows: int = 40) -> tuple[PartyIntegrity, PartyInputs]:
    cfg = parse_config(_config(tmp_path, party))
    images = torch.linspace(0, 1, rows * 64).reshape(rows, 1, 8, 8)
    inputs = PartyInputs(images, torch.zeros(rows, 0, dtype=torch.int64), InputSpec(0, (), (1, 8, 8)))
    return PartyIntegrity(cfg, 1, inputs, np.array([3, 7])), inputs


def test_trigger_noise_and_missing_rows_by_hand(tmp_path: Path) -> None:
    integrity, inputs = _party(tmp_path, {**ALL_THREE, "backdoor": {"trigger_value": 9.0}})
    ids = np.array([0, 5])
    triggered, _ = integrity.rows(inputs, ids, "backdoor")
    changed = (triggered != inputs.numeric[ids]).nonzero().tolist()
    # VFLAIR's pattern at the slice's bottom-right corner: (7,7), (6,6), (5,7), (7,5)
    assert sorted({(y, x) for _, _, y, x in changed}) == [(5, 7), (6, 6), (7, 5), (7, 7)]
    assert (triggered[:, 0, [7, 6, 5, 7], [7, 6, 7, 5]] == 9.0).all()
    noisy, _ = integrity.rows(inputs, ids, "noisy")
    low, high = float(integrity.low), float(integrity.high)
    assert noisy.min() >= low and noisy.max() <= high and not torch.equal(noisy, inputs.numeric[ids])
    assert torch.equal(noisy[1], integrity.rows(inputs, np.array([5]), "noisy")[0][0])  # per row
    clean, _ = integrity.rows(inputs, ids, "")
    assert torch.equal(clean, inputs.numeric[ids])
    assert integrity.zeroed(8, train=False, step=0, variant="missing").all()
    assert integrity.zeroed(8, train=False, step=0, variant="") is None
    assert int(integrity.zeroed(8, train=True, step=4, variant="").sum()) == 2  # ⌊0.25 · 8⌋


def test_the_swap_backpropagates_the_target_rows_gradient_into_the_triggered_row(
        tmp_path: Path) -> None:
    """VFLAIR's replacement: the sent activation of each known target row is the triggered row's,
    and the gradient received for those rows trains the triggered row's forward as well."""
    integrity, inputs = _party(tmp_path, {"backdoor": {"trigger_value": 9.0}})
    cfg = parse_config(_config(tmp_path, {"backdoor": {"trigger_value": 9.0}}))
    trainer = BottomTrainer(cfg, 1, inputs, 10, integrity=integrity)
    trainer.model = Bottom(None, nn.Sequential(nn.Flatten(), nn.Linear(64, 2, bias=False)))
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
    ids = np.array([1, 3, 5, 7])  # 3 and 7 are the known targets
    swap = integrity.swap(ids, epoch=0)
    assert isinstance(swap, Swap) and swap.rows.tolist() == [1, 3]
    weight = trainer.model.body[1].weight.detach().clone()
    sent = trainer.forward(ids, train=True, epoch=0)
    poisoned_x = integrity.trigger(inputs.numeric[[swap.poisoned]]).flatten(1)
    assert torch.allclose(sent[[1, 3]], (poisoned_x @ weight.T).expand(2, 2))
    assert torch.allclose(sent[[0, 2]], inputs.numeric[[1, 5]].flatten(1) @ weight.T)
    g = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 4.0]])
    trainer.backward(g)
    x = inputs.numeric[ids].flatten(1)
    expected = g.T @ x + (g[1] + g[3])[:, None] * poisoned_x  # every row's own, plus the swap
    assert torch.allclose(weight - trainer.model.body[1].weight, expected, atol=1e-5)


# --- the scores, by hand -------------------------------------------------------------------


def _pass(accuracy: float, clean: float, confusion: list[list[int]], test_accuracy: float = 0.9,
          test_rows: int = 100) -> VariantPass:
    return VariantPass(10, test_accuracy, test_rows, accuracy, clean, np.array(confusion))


def test_success_rates_by_hand() -> None:
    confusion = np.array([[2, 0, 0], [3, 1, 0], [1, 0, 3]])  # rows: true class, columns: predicted
    asr, others = success_rates(confusion, target=0)
    assert asr == pytest.approx(6 / 10)  # VFLAIR: every triggered row predicted as 0
    assert others == pytest.approx(4 / 8)  # the 8 rows of classes 1 and 2
    assert success_rates(np.array([[4, 0], [0, 0]]), 0) == (1.0, None)


def test_missing_features_accuracy_by_hand() -> None:
    # 100 test rows at 0.9, 20 of them missing: 0.5 missing vs 0.95 clean -> mixed 0.81
    final = _pass(0.5, 0.95, [[10, 0], [0, 10]])
    assert mixed_accuracy(final) == pytest.approx((90 - 19 + 10) / 100)


def test_the_backdoor_draws_its_rows_from_the_subset_the_label_party_trains_on(
        tmp_path: Path) -> None:
    from splitleak.datasets import build_dataset, train_test_ids
    from splitleak.inputs import split_ids
    from splitleak.integrity import known_targets, poisoned_rows

    backdoor = {"known_targets": 10, "poison_fraction": 0.05}
    dataset = build_dataset("digits", {})
    rows = dataset.schema().num_rows
    whole = parse_config(_config(tmp_path, {"backdoor": backdoor}))
    train, _ = train_test_ids(rows, whole.dataset.test_fraction, whole.run.seed)
    settings = whole.threat.party(1).backdoor
    targets = known_targets(whole, dataset, 1, settings)
    assert targets.size == 10 and np.isin(targets, train).all()
    assert poisoned_rows(whole, rows, 1, settings).size == round(0.05 * train.size)
    # dataset.subset: every known target and poisoned row is one the label party trains on (they
    # were drawn from the whole train split: 2 of 10 known targets were ever in a batch)
    data = _config(tmp_path, {"backdoor": backdoor})
    data["dataset"] = {**data["dataset"], "subset": 0.2}
    cfg = parse_config(data)
    trained, _ = split_ids(cfg, rows)
    targets = known_targets(cfg, dataset, 1, settings)
    poisoned = poisoned_rows(cfg, rows, 1, settings)
    assert targets.size == 10 and np.isin(targets, trained).all()
    assert poisoned.size == round(0.05 * trained.size) and np.isin(poisoned, trained).all()


# --- runs ----------------------------------------------------------------------------------


def _integrity(run: RunDir) -> dict[str, dict]:
    return {e["name"]: e for e in analyze(run.root)["leak"] if e["layer"] == "output"}


def test_the_attacks_succeed_without_a_defense_and_fail_under_mid(tmp_path: Path) -> None:
    plain = _integrity(reference_run(_config(tmp_path)))
    backdoor, noisy, missing = (plain[n]["integrity"] for n in
                                ("replacement_backdoor", "noisy_samples", "missing_features"))
    assert plain["replacement_backdoor"]["family"] == "targeted_backdoor"
    assert {plain[n]["family"] for n in ("noisy_samples", "missing_features")} == {"non_targeted"}
    assert backdoor["value"] > 0.8 and backdoor["asr_non_target"] > 0.8  # chance: 0.1
    assert backdoor["test_accuracy"] > 0.9  # the main task barely notices
    assert noisy["value"] > 0.1 and noisy["paired_drop"] > 0.05
    assert plain["replacement_backdoor"]["ap"]["value"] == backdoor["value"]
    assert plain["noisy_samples"]["ap"]["value"] == max(0.0, noisy["value"])
    assert missing["rows"] == 90 and missing["evaluations"] == 20
    defended = _integrity(reference_run(_config(tmp_path, objective={"name": "mid", "lambda": 1.0})))
    assert defended["replacement_backdoor"]["integrity"]["asr_non_target"] < 0.1
    assert defended["noisy_samples"]["integrity"]["paired_drop"] < 0.05


def test_more_known_targets_than_the_class_has_are_reported_as_known(tmp_path: Path) -> None:
    # the party knows at most the target class's train rows: the summary says how many, and warns
    # that the config's count (printed in the threat model) was not what it knew
    one_epoch = {"batch_size": 64, "epochs": 1, "eval_interval": 0}
    many = {"backdoor": {"known_targets": 5000, "trigger_value": 100.0}}
    run = reference_run(_config(tmp_path, many, training=one_epoch))
    summary = analyze(run.root)
    entry = next(e for e in summary["leak"] if e["name"] == "replacement_backdoor")
    table = pq.read_table(run.labels).to_pydict()
    labels = np.array(table["label"])[np.array(table["split"]) == "train"]
    assert entry["integrity"]["known_targets"] == int((labels == 0).sum()) < 5000
    assert any(f"backdoor.known_targets = 5000, but only {(labels == 0).sum()} train rows have "
               "class 0" in w for w in summary["warnings"]), summary["warnings"]
    run = reference_run(_config(tmp_path, {"backdoor": {"known_targets": 7}}, training=one_epoch))
    summary = analyze(run.root)
    entry = next(e for e in summary["leak"] if e["name"] == "replacement_backdoor")
    assert entry["integrity"]["known_targets"] == 7
    assert not any("known_targets" in w for w in summary["warnings"])


def test_the_premise_is_the_declared_attack(tmp_path: Path) -> None:
    run = reference_run(_config(tmp_path, {"missing_features": {"missing_rate": 0.25}},
                            training={"batch_size": 64, "epochs": 1, "eval_interval": 0}))
    summary = analyze(run.root, [("replacement_backdoor", {}), ("missing_features", {})])
    entries = {e["name"]: e for e in summary["leak"]}
    assert "does not" in entries["replacement_backdoor"]["error"]
    assert entries["replacement_backdoor"]["ap"]["value"] is None
    assert "integrity" in entries["missing_features"]


@pytest.mark.slow
def test_over_the_wire_equals_the_reference(tmp_path: Path) -> None:
    """Every party its own process: the attacking party's swaps, missing rows and the
    evaluation of its variants give the in-process reference's numbers bit for bit."""
    from tests.runs import assert_same_run, distributed_and_reference

    data = _config(tmp_path, training={"batch_size": 128, "epochs": 2, "eval_interval": 0})
    distributed, reference = distributed_and_reference(tmp_path, data)
    assert_same_run(distributed, reference, parties=1)
    assert _integrity(distributed).keys() == {"replacement_backdoor", "noisy_samples",
                                              "missing_features"}


def test_report_md_names_every_attacking_partys_threat() -> None:
    from attacker.attacks.integrity.report import integrity_md

    summary = {"leak": [{"scope": "run", "layer": "output", "party_id": k, "attack": attack,
                         "threat": threat, "error": "stopped"}
                        for k, attack, threat in ((1, "noisy_samples", "malicious, noisy"),
                                                  (2, "missing_features", "malicious, missing"))]}
    text = " ".join(integrity_md(summary))
    assert "(threat: party 1: malicious, noisy; party 2: malicious, missing)" in text
    assert "- noisy_samples, party 1: stopped" in text and "- missing_features, party 2: stopped" in text


def test_the_headline_sets_the_paired_drop_beside_vflairs() -> None:
    """A probe's missing_features row read "drop -0.083 (acc. 0.600; same rows clean 0.600)": a
    drop the attack did not cause (VFLAIR's AP sets the test accuracy against other rows). The
    headline now names VFLAIR's figure and gives the paired drop of the same rows."""
    from attacker.attacks.integrity.report import _headline

    figures = {"metric": "accuracy_drop", "value": 0.517 - 0.6, "missing_accuracy": 0.6,
               "clean_accuracy_same_rows": 0.6, "paired_drop": 0.0}
    assert _headline(figures) == ("drop -0.083 (VFLAIR's); paired 0.000: same rows 0.600 clean "
                                  "→ 0.600")
    noisy = {"metric": "accuracy_drop", "value": -0.15, "noisy_accuracy": 0.667,
             "clean_accuracy_same_rows": 0.333, "paired_drop": 0.333 - 0.667}
    assert _headline(noisy) == "drop -0.150 (VFLAIR's); paired -0.334: same rows 0.333 clean → 0.667"
