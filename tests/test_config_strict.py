"""A config's lists are read as written, as its single values are: a plug-in list that is not a
list, a boolean or a float where a list holds integers, and a named attack that cannot score
the dataset's task are each refused naming the field (exit 2, never a traceback); a split that
leaves next to nothing to train on is warned of."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from orchestration.cli import main as splitleak_main
from splitleak.config import ConfigError, parse_config
from splitleak.validation import validate
from tests.conftest import small_config, write_config
from tests.test_cli_refusals import exit_code_and_text

DIGITS = {"dataset": {"name": "digits"}, "features": {"passive": [[0, 4], [4, 8]]}}


def refusal(tmp_path: Path, **override: Any) -> str:
    with pytest.raises(ConfigError) as err:
        validate(parse_config(small_config(tmp_path, **override)))
    return " ".join(str(err.value).split())


@pytest.mark.parametrize(("override", "message"), [
    ({"defense": 0.5}, "defense: a list is expected, not the number 0.5; write one "
                       "[[defense]] table per defense (double brackets), or defense = [\"name\", ...]"),
    ({"defense": False}, "defense: a list is expected, not the boolean false"),
    ({"attacker": {"attacks": 3}}, "attacker.attacks: a list is expected, not the "
                                   "number 3; write attacks = [\"norm\", ...]"),
])
def test_a_plugin_list_that_is_not_a_list_is_refused(tmp_path: Path, override: dict[str, Any],
                                                     message: str) -> None:
    assert message in refusal(tmp_path, **override)


@pytest.mark.parametrize(("override", "message"), [
    ({"model": {"layers": [True, 8]}}, "model.layers.0: true is a boolean; give an integer"),
    ({"model": {"kind": "cnn", "channels": [True]}}, "model.channels.0: true is a boolean"),
    ({"threat": {"parties": {"1": {"hints": [True]}}}},
     "threat.parties.1.hints.0: true is a boolean; give an integer"),
    ({"features": {"passive": [[0.0, 15], [15, 30]]}},
     "features.passive.0.0: 0.0 is not a whole number; give an integer (TOML: 8, not 8.0)"),
    ({"features": {"ratios": [True, 1]}}, "features.ratios.0: true is a boolean; give a number"),
    ({"threat": {"collusion": [[1, 2.0]]}}, "threat.collusion.0.1: 2.0 is not a whole number"),
    ({"threat": {"parties": {"1": {"clamp": [False, 5.0]}}}},
     "threat.parties.1.clamp.0: false is a boolean; give a number"),
    ({"protection": {"parties": [True]}}, "protection.parties.0: true is a boolean"),
    ({"evaluation": {"clean_anchors": [1.0]}}, "evaluation.clean_anchors.0: 1.0 is not"),
    ({"training": {"epochs": 2.0}}, "training.epochs: 2.0 is not a whole number"),
    ({"dataset": {"name": "mnist_5k_binary", "params": {"positive_digits": [True]}}},
     "positive_digits.0: true is a boolean"),
])
def test_list_items_and_counts_are_taken_as_written(tmp_path: Path, override: dict[str, Any],
                                                    message: str) -> None:
    assert message in refusal(tmp_path, **override)


def test_numbers_as_written_still_pass(tmp_path: Path) -> None:
    """Integers where numbers are wanted (ratios, clamp), and integers in integer lists."""
    cfg = parse_config(small_config(tmp_path, features={"ratios": [1, 1.5]},
                                    threat={"parties": {"1": {"clamp": [1, 5], "hints": [2]}}}))
    assert cfg.features.ratios == [1.0, 1.5] and cfg.threat.parties["1"].clamp == (1.0, 5.0)


def test_the_probe_files_exit_2_naming_the_field(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    cases = {"defense = 0.5\n": "defense: a list is expected, not the number 0.5",
             "[attacker]\nattacks = 3\n": "attacker.attacks: a list is expected",
             "[model]\nlayers = [true, 8]\n": "model.layers.0: true is a boolean"}
    base = '[dataset]\nname = "breast_cancer"\n[features]\npassive = [[0, 15], [15, 30]]\n'
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"c{i}.toml"
        path.write_text(text + base if text.startswith("defense") else base + text)
        code, out = exit_code_and_text(splitleak_main, ["validate", str(path)], capsys)
        assert code == 2 and message in out and "Traceback" not in out, out


@pytest.mark.parametrize(("attacks", "message"), [
    (["norm", "cosine_oracle"], "attacker.attacks[0] (norm): it ranks two classes (one score per "
                                "row), and digits has 10 classes, so it would not run; allowed for "
                                "10 classes: batch_label_counts, clustering, direct_label"),
    (["clustering", {"name": "mean", "centers": "oracle"}], "attacker.attacks[1] (mean(centers=oracle))"),
])
def test_an_attack_that_cannot_score_the_task_is_refused(tmp_path: Path, attacks: list[Any],
                                                         message: str) -> None:
    assert message in refusal(tmp_path, **DIGITS, attacker={"attacks": attacks})


def test_attacks_for_the_task_pass_and_a_denied_premise_is_warned_of(tmp_path: Path) -> None:
    multi = validate(parse_config(small_config(tmp_path, **DIGITS, attacker={
        "attacks": ["direct_label", "clustering", "batch_label_counts"]})))
    binary = validate(parse_config(small_config(tmp_path, attacker={"attacks": ["direct_label"]})))
    for validated in (multi, binary):
        assert any(w.startswith("attacker.attacks[0] (direct_label) needs the gradient of the logits")
                   and "not applicable on every batch" in w for w in validated.warnings), validated.warnings
    flat = validate(parse_config(small_config(
        tmp_path, attacker={"attacks": ["direct_label", "norm"]},
        model={"kind": "mlp", "layers": [16, 8], "cut_layer": 2, "top": "none", "aggregation": "sum"})))
    assert not any("direct_label" in w for w in flat.warnings), flat.warnings


def test_analyze_refuses_attacks_that_cannot_score_the_runs_task(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from attacker.cli import main as attacker_main
    from splitleak.artifacts.paths import RunDir

    run = RunDir(tmp_path / "run")
    run.labels.parent.mkdir(parents=True)
    ids = np.arange(30)
    pq.write_table(pa.table({"sample_id": ids, "label": ids % 10, "split": ["train"] * 30}),
                   run.labels)
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run.root), "--attacks", "clustering",
                                                    "hint_inner:k=3"], capsys)
    assert code == 2 and "Traceback" not in text, text
    assert "--attacks (hint_inner(k=3)): it ranks two classes" in " ".join(text.split())
    assert "has 10 classes" in text


@pytest.mark.parametrize(("dataset", "message"), [
    ({"test_fraction": 0.999}, "dataset.test_fraction = 0.999 leaves 1 of the 569 rows to train on: "
                               "one train step (training.batch_size = 64, training.epochs = 1), and a "
                               "batch of one row holds one class, so every leak attack skips it"),
    ({"subset": 0.0001}, "dataset.test_fraction = 0.25 and dataset.subset.fraction = 0.0001 leave 2 "
                         "of the 569 rows to train on: one train step"),
])
def test_a_split_that_leaves_next_to_nothing_to_train_on_is_warned_of(
        tmp_path: Path, dataset: dict[str, Any], message: str) -> None:
    cfg = parse_config(small_config(tmp_path, dataset=dataset, training={"epochs": 1}))
    assert message in validate(cfg).warnings[0]
    assert not any("rows to train on" in w for w in validate(parse_config(small_config(tmp_path))).warnings)


def test_run_warns_of_a_split_that_leaves_next_to_nothing_to_train_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from splitleak.cli_common import checked_config_or_exit

    path = write_config(tmp_path, small_config(tmp_path, dataset={"test_fraction": 0.999},
                                                    training={"epochs": 1}))
    checked_config_or_exit(path)  # what `splitleak run` loads its config with
    assert "leaves 1 of the 569 rows to train on" in caplog.text


def test_finite_floats_in_lists_still_refused(tmp_path: Path) -> None:
    assert "features.ratios.0: Input should be a finite number" in refusal(
        tmp_path, features={"ratios": [math.inf, 1]})


def test_a_party_with_another_config_is_told_which_sections_differ() -> None:
    """At e924758 the refusal named only the two config hashes (an operator could not tell
    whether the data path, the model or the seed differed)."""
    from label_party.session import differing_sections
    from splitleak.config import load_config

    cfg = load_config(None)
    other = cfg.model_copy(update={"training": cfg.training.model_copy(update={"epochs": 7}),
                                   "run": cfg.run.model_copy(update={"seed": 9})})
    assert set(cfg.section_hashes()) == set(cfg.model_dump(exclude={"evaluation"}))
    assert differing_sections(cfg.section_hashes(), other.section_hashes()) == \
        ", in [run] and [training]"
    assert differing_sections(cfg.section_hashes(), {}) == ""  # a party that sent none
    hostile = {**cfg.section_hashes(), "x" * 500: "0"}  # names this config lacks are not echoed
    assert "x" not in differing_sections(cfg.section_hashes(), hostile)


def test_a_party_with_another_config_is_told_which_fields_differ() -> None:
    """At 97c5036 the refusal named only sections: [training] has some twenty fields."""
    from label_party.session import differing_fields
    from splitleak.config import load_config

    cfg = load_config(None)
    other = cfg.model_copy(update={"training": cfg.training.model_copy(update={"epochs": 7}),
                                   "run": cfg.run.model_copy(update={"seed": 9})})
    own = cfg.field_hashes()
    assert {"run.seed", "training.epochs", "model.layers"} <= set(own)
    assert differing_fields(own, other.field_hashes()) == ", in run.seed and training.epochs"
    assert differing_fields(own, {}) == ""  # a party from before config_fields: sections instead
    assert differing_fields(own, dict(own)) == ""
    # A field one of them lacks differs; a party's own names are echoed, cut short.
    theirs = {name: digest for name, digest in own.items() if name != "run.seed"}
    theirs["defense.0.s"] = "0"
    theirs["x" * 150] = "0"
    said = differing_fields(own, theirs)
    assert said.startswith(", in defense.0.s, run.seed and xxx") and "(150 characters)" in said
    many = {name: "0" for name in own}
    said = differing_fields(own, many)
    assert said.count(",") == 10 and said.endswith(f" and {len(own) - 10} more")


def test_a_list_of_tables_is_named_by_index_and_empty_tables_have_no_fields() -> None:
    from splitleak.config import leaves

    assert leaves({"defense": [{"name": "marvell", "s": 4.0}], "run": {"devices": {}},
                    "attacker": {"attacks": []}, "model": {"layers": [8, 8]}}) == \
        [("defense.0.name", "marvell"), ("defense.0.s", 4.0), ("model.layers", [8, 8])]


def test_the_config_maps_of_a_join_are_bounded() -> None:
    from splitleak.config import load_config
    from splitleak.wire import CONFIG_MAP_ENTRIES, config_map_problem

    assert config_map_problem("m", load_config(None).field_hashes()) is None
    assert "4097 entries; at most 4096" in config_map_problem(
        "m", {str(i): "0" for i in range(CONFIG_MAP_ENTRIES + 1)})
    assert "a name is printable and at most 200" in config_map_problem("m", {"x" * 201: "0"})
    assert "a name is printable" in config_map_problem("m", {"a\nb": "0"})
    assert "a hash is at most 64" in config_map_problem("m", {"a": "0" * 65})

