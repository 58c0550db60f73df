"""What a config says is what runs: values as written (no text for numbers, no numbers for
booleans), finite floats, bounded counts, lists written as lists, each plug-in's premise and a
model's memory checked by validate, and settings the run would not use named."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest

from splitleak.config import ConfigError, parse_config
from splitleak.validation import validate
from tests.conftest import small_config, write_config
from tests.test_cli_refusals import exit_code_and_text


def refusal(tmp_path: Path, **override: Any) -> str:
    with pytest.raises(ConfigError) as err:
        validate(parse_config(small_config(tmp_path, **override)))
    return " ".join(str(err.value).split())


@pytest.mark.parametrize(("override", "message"), [
    ({"topology": {"tls": "false"}}, "topology.tls: 'false' is text; give true or false"),
    ({"run": {"torch_threads": "4"}},
     "run.torch_threads: '4' is text; give a number or 'auto'"),
    ({"training": {"batch_size": True}},
     "training.batch_size: True is a boolean; give a number"),
    ({"run": {"deterministic": 1}}, "run.deterministic: 1 is a number; give true or false"),
    ({"dataset": {"name": "breast_cancer", "subset": True}},  # said "a valid dictionary or
     # instance of SubsetConfig"
     "dataset.subset: the boolean true is not a subset; give its fraction of the rows (e.g. "
     "subset = 0.1) or a table (subset = { fraction = 0.1, seed = 7 }) (got True)"),
    ({"training": {"optimizer": {"name": "adam", "lr": math.inf}}},
     "training.optimizer.lr: Input should be a finite number"),
    ({"features": {"ratios": [math.inf, 1]}}, "features.ratios.0: Input should be a finite number"),
    ({"defense": [{"name": "laplace", "b": math.inf}]}, "defense[0].b: Input should be a finite number"),
    ({"objective": {"name": "mid", "shift": math.nan}}, "objective.shift: Input should be a finite number"),
    ({"threat": {"parties": {"1": {"backdoor": {"trigger_value": math.nan}}}}},
     "trigger_value: Input should be a finite number"),
    ({"run": {"torch_threads": 10**18}},
     f"run.torch_threads: {10**18} threads; allowed: 'auto' or 1..4096"),
    ({"model": {"kind": "mlp", "layers": [16, 8], "cut_layer": 1, "embedding_dim": 100_000}},
     "model.embedding_dim: Input should be less than or equal to 4096"),
    ({"attacker": {"attacks": [{"name": "clustering", "n_init": 10**18}]}},
     "n_init: Input should be less than or equal to 1000"),
    ({"threat": {"parties": {"1": {"labelled_per_class": 10**20}}}},  # model completion's bound
     "threat.parties.1.labelled_per_class: Input should be less than or equal to 100000000"),
    ({"defense": {"name": "laplace", "b": 0.1}},
     "defense: a list is expected, not one table; write one [[defense]] table"),
    ({"attacker": {"attacks": {"name": "norm"}}},
     "attacker.attacks: a list is expected, not one table"),
    # each said "Input should be a valid dictionary or instance of PluginSpec"
    ({"objective": 5}, "objective: the number 5 is not a plug-in's name or table; write "
     "objective = \"name\", or an [objective] table"),
    ({"defense": [5]}, "defense: item 0 is the number 5, not a plug-in's name or table; write one "
     "[[defense]] table"),
    ({"attacker": {"attacks": ["norm", True]}},
     "attacker.attacks: item 1 is the boolean true, not a plug-in's name or table"),
    ({"training": {"optimizer": {"name": "adam", "momentum": 0.9}}},
     "momentum = 0.9 is SGD's; adam takes none"),
    ({"dataset": {"name": "spambase", "params": {"path": ""}}, "features": {"ratios": [1, 1]}},
     "dataset.params.path: it is empty; give the path of the data file"),
    ({"dataset": {"name": "wine"}, "features": {"passive": [[0, 6], [6, 13]]},
      "objective": {"name": "gafm"}, "model": {"kind": "mlp", "layers": [16, 8], "cut_layer": 2,
                                               "top": "none", "aggregation": "sum"}},
     "objective gafm is binary; wine has 3 classes"),
    ({"dataset": {"name": "digits_binary"}, "features": {"passive": [[2, 5], [5, 8]],
                                                          "label_party": [0, 2]},
      "objective": {"name": "kdk", "k": 3}}, "objective.k = 3 exceeds the 2 classes of digits_binary"),
    ({"model": {"kind": "mlp", "layers": [60_000, 60_000, 60_000], "cut_layer": 1}},
     "model: its weights take"),
    ({"dataset": {"name": "wine"}, "features": {"passive": [[0, 6], [6, 13]]},
      "defense": [{"name": "marvell", "s": 4.0}]},
     "defense[0]: marvell is defined for two classes; wine has 3"),
])
def test_validate_refuses_naming_the_field(tmp_path: Path, override: dict[str, Any],
                                           message: str) -> None:
    assert message in refusal(tmp_path, **override)


@pytest.mark.parametrize(("section", "field", "value", "bound"), [
    ("training", "eval_interval", 10**20, "1000000000"),
    ("training", "max_steps", 10**20, "1000000000"),
    ("training", "checkpoint_every", 10**20, "1000000000"),
    ("topology", "join_deadline_s", 1e10, "604800"),
    ("topology", "step_deadline_s", 1e300, "604800"),
])
def test_counts_and_deadlines_beyond_their_bound_are_refused(
        tmp_path: Path, section: str, field: str, value: float, bound: str) -> None:
    """Each passed validate, then overflowed the Join's uint64 plan fields (UNKNOWN, exit 1) or
    the gRPC deadline (an immediate DEADLINE_EXCEEDED)."""
    message = refusal(tmp_path, **{section: {field: value}})
    assert f"{section}.{field}: Input should be less than or equal to {bound}" in message, message
    parse_config(small_config(tmp_path, **{section: {field: float(bound) if field.endswith("_s")
                                                     else int(bound)}}))


def test_feature_ratios_whose_sum_overflows_are_refused(tmp_path: Path) -> None:
    """ratios = [1e308, 1e308] passed validate after numpy's 'overflow encountered in reduce'
    (their sum is inf); each ratio is bounded, and ratios at the bound split without a warning."""
    message = refusal(tmp_path, features={"ratios": [1e308, 1e308]})
    assert ("features.ratios.0: Input should be less than or equal to 1000000 (got 1e+308)"
            in message), message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(parse_config(small_config(tmp_path, features={"ratios": [1e6, 1e6]})))


def test_more_ratios_than_columns_say_how_many_are_allowed(tmp_path: Path) -> None:
    """'features.ratios: 32 parties but only 30 columns' said what was wrong, not what is
    allowed."""
    message = refusal(tmp_path, features={"ratios": [1] * 32}, topology={"passive_parties": 32})
    assert ("features.ratios: 32 parties but only 30 columns; each party holds at least one "
            "(allowed: at most 30 ratios, with topology.passive_parties = as many)") in message, message


def test_values_as_written_still_pass(tmp_path: Path) -> None:
    """An integer for a float, a listed word ("auto"), a bounded count at its bound."""
    cfg = parse_config(small_config(tmp_path, run={"torch_threads": 4096},
                                    training={"optimizer": {"name": "sgd", "lr": 1, "momentum": 0.5}},
                                    attacker={"attacks": [{"name": "clustering", "n_init": 1000}]}))
    assert cfg.training.optimizer.lr == 1.0 and cfg.run.torch_threads == 4096


def test_settings_the_run_would_not_use_are_warned_of(tmp_path: Path) -> None:
    validated = validate(parse_config(small_config(
        tmp_path, attacker={"enabled": False, "attacks": ["norm"]},
        threat={"parties": {"1": {"hints": [1, 64]}}})))
    assert any("attacker.attacks is not used: attacker.enabled = false" in w
               for w in validated.warnings), validated.warnings
    assert not any("known positives" in w for w in validated.warnings)  # no hint attack runs
    validated = validate(parse_config(small_config(
        tmp_path, threat={"parties": {"1": {"hints": [1, 64]}}})))  # the defaults: they run
    assert any("threat.parties.1.hints: [64] known positives per batch of 64 rows" in w
               for w in validated.warnings), validated.warnings


def run_in_process(tmp_path: Path, capsys: pytest.CaptureFixture, **override: Any) -> tuple[int, str]:
    from orchestration.cli import main

    override["training"] = {"epochs": 1, **override.get("training", {})}
    path = write_config(tmp_path, small_config(tmp_path, **override))
    code, text = exit_code_and_text(main, ["run", "--in-process", "--no-progress", str(path)], capsys)
    return code, " ".join(text.split())


def test_an_attack_that_skips_every_batch_is_reported_as_skipped(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, text = run_in_process(tmp_path, capsys, attacker={"attacks": [{"name": "hint_distance",
                                                                          "k": 64}]})
    assert code == 0, text
    assert "Traceback" not in text and "hint_distance(k=64)" in text
    (report,) = (tmp_path / "runs").glob("*/report/report.md")
    assert "hint_distance(k=64)" in report.read_text()


def test_a_run_that_diverges_in_process_fails_in_one_sentence(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, text = run_in_process(tmp_path, capsys, training={"optimizer": {"lr": 1e18}})
    assert code == 1 and "Traceback" not in text, text
    assert "run failed: the loss of train step" in text or "run failed: train step" in text, text
    (outcome,) = (tmp_path / "runs").glob("*/label_party/outcome.json")
    assert '"status": "failed"' in outcome.read_text()


def test_a_test_split_of_one_class_is_refused(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    code, text = run_in_process(tmp_path, capsys, dataset={"test_fraction": 0.001})
    assert code == 2, text
    assert "dataset.test_fraction = 0.001 leaves 1 test row(s), all of class" in text


def test_attacks_asked_for_that_rank_two_classes_are_named_on_a_multi_class_run() -> None:
    from attacker.analysis.analyze import _not_for_classes

    assert _not_for_classes([("norm", {}), ("direct_label", {}), ("hint_inner", {"k": 3})], 10) == [
        "norm, hint_inner(k=3): rank two classes, and this run has 10: not run"]
    assert _not_for_classes([("norm", {})], 2) == [] and _not_for_classes(None, 10) == []


def test_warnings_print_brackets_as_text() -> None:
    from rich.console import Console

    from attacker.report.terminal import print_warnings

    console = Console(record=True, width=200)
    print_warnings(console, {"warnings": ["declared white_box = true in [threat.parties.K]"]})
    assert "declared white_box = true in [threat.parties.K]" in console.export_text()


def test_hint_centers_beyond_half_a_batch_are_warned_of(tmp_path: Path) -> None:
    """`mean(centers=hint, hints=50)` on batches of 32 ran and was labelled '≥50/class' without a
    word, though at most 16 labels are revealed per batch; validate now says so."""
    validated = validate(parse_config(small_config(
        tmp_path, training={"batch_size": 32},
        attacker={"attacks": [{"name": "mean", "centers": "hint", "hints": 50},
                              {"name": "median", "centers": "hint", "hints": 4}, "norm"]})))
    capped = [w for w in validated.warnings if "reveals at most" in w]
    assert capped == ["attacker.attacks[0] (mean(centers=hint, hints=50)): 50 known labels of each "
                      "class need 100 rows, but a batch of 32 rows (training.batch_size) reveals "
                      "at most 16 (half of it, leaving the rest to measure): its class centers "
                      "come from those"], validated.warnings


def test_a_plugin_wide_error_names_the_plugin_not_an_empty_field(tmp_path: Path) -> None:
    """`dp_gaussian` without clip said "defense[0].: …" (an empty field name)."""
    with pytest.raises(ConfigError) as err:
        validate(parse_config(small_config(
            tmp_path, defense=[{"name": "dp_gaussian", "noise_multiplier": 1.0}])))
    assert "defense[0]: give exactly one of clip" in str(err.value), str(err.value)


def test_hint_counts_that_leave_no_pair_to_score_are_warned_of_only_where_hint_attacks_run(
        tmp_path: Path) -> None:
    """k ≥ batch_size − 1 leaves at most one row once the k known positives are left out, so
    the hint attack skips every batch: batches of 4 with k = 3 did so without a word (only
    k ≥ 4 was named), and a multi-class run, which runs no hint attack, was warned of them."""
    def hint_warnings(**sections: Any) -> list[str]:
        warnings = validate(parse_config(small_config(tmp_path, **sections))).warnings
        return [w for w in warnings if "known positives" in w]

    binary = hint_warnings(training={"batch_size": 4}, threat={"parties": {"1": {"hints": [1, 2, 3, 5]}}})
    assert binary == ["threat.parties.1.hints: [3, 5] known positives per batch of 4 rows "
                      "(training.batch_size) leave at most one row to infer, never a positive "
                      "and a negative: the hint attacks with these k will skip every batch"]
    assert hint_warnings(training={"batch_size": 4}, attacker={"attacks": ["norm"]}) == []
    named = hint_warnings(training={"batch_size": 4},
                          attacker={"attacks": [{"name": "hint_inner", "k": 3}]})
    assert len(named) == 1 and named[0].startswith("attacker.attacks[0] (hint_inner(k=3)): 3 known")
    digits = hint_warnings(dataset={"name": "digits"}, features={"passive": [[0, 4], [4, 8]]},
                           training={"batch_size": 2})
    assert digits == []


def test_the_analysis_warns_of_hint_counts_for_the_attacks_it_runs(tmp_path: Path) -> None:
    """`attacker analyze --attacks norm` was warned of the config's hints, though no hint attack
    ran, and `--attacks hint_distance:k=63` on batches of 64 skipped every batch without a word:
    the warnings looked at the config's attacker.attacks, not at what the analysis ran."""
    from attacker.analysis.inputs import config_warnings

    config = small_config(tmp_path, training={"batch_size": 64},
                          threat={"parties": {"1": {"hints": [63]}}})

    def hint_warnings(*args: Any) -> list[str]:
        return [w for w in config_warnings(config, 2, *args) if "known positives" in w]

    assert len(hint_warnings()) == 1  # the defaults run the hint attacks with the party's hints
    assert hint_warnings([("norm", {})], None, "--attacks") == []
    named = hint_warnings([("hint_distance", {"k": 63})], None, "--attacks")
    assert len(named) == 1 and named[0].startswith("--attacks[0] (hint_distance(k=63)): 63 known")
    given = hint_warnings([("hint_distance", {})], [1, 63], "--attacks")
    assert len(given) == 1 and given[0].startswith("--hints: [63] known positives"), given


@pytest.mark.parametrize(("override", "line"), [
    ({"topology": {"passive_parties": 3}},  # a check across sections: its sentence names them
     "features.passive lists 2 parties but topology.passive_parties = 3"),
    ({"training": {"optimizer": {"name": "adam", "momentum": 0.9}}},
     "training.optimizer: momentum = 0.9 is SGD's; adam takes none"),
    ({"defense": [{"name": "dp_gaussian", "noise_multiplier": 1.0}]},
     "defense[0]: give exactly one of clip"),
])
def test_a_validators_sentence_is_shown_without_pydantics_prefix(
        tmp_path: Path, override: dict[str, Any], line: str) -> None:
    """A model validator's refusal read "(top level): Value error, features.passive lists 3
    parties ..."; a user reads "<field path>: <sentence>" (the sentence alone where it compares
    fields across sections), with no "Value error," or "(top level)" noise."""
    message = refusal(tmp_path, **override)
    assert line in message, message
    assert "Value error" not in message and "top level" not in message, message


def test_cae_memory_is_bounded_at_validation(tmp_path: Path) -> None:
    """CAE draws `rows` random label vectors (rows × K floats, three times over while they are
    sharpened): rows = 100,000,000 (allowed up to MAX_ROWS) asked for gigabytes before the first
    step, as did batch_size × hidden. Validation now refuses both, naming the fields and the
    largest value allowed; the references' set-up and a few million rows pass."""
    def cae(**params: Any) -> dict[str, Any]:
        return {"objective": {"name": "cae", "lambda": 0.5, **params}}

    message = refusal(tmp_path, **cae(rows=100_000_000))
    assert "objective.rows = 100,000,000 random label vectors of 2 classes take 3.7 GiB while " \
           "the autoencoder trains, over the 2 GiB allowed: give at most 53,687,091 rows" in message
    ten = {"dataset": {"name": "digits"}, "features": {"passive": [[0, 4], [4, 8]]},
           "model": {"kind": "cnn"}}
    assert "give at most 15,790,320 rows (10 classes" in refusal(
        tmp_path, **ten, **cae(rows=20_000_000))
    message = refusal(tmp_path, **cae(rows=1_000_000, batch_size=1_000_000, hidden=65_536))
    assert "objective.batch_size = 1,000,000 rows × objective.hidden = 65,536 units take " \
           "1953.1 GiB" in message, message
    for params in ({}, {"rows": 5_000_000}, {"rows": 100, "batch_size": 1_000_000, "hidden": 65_536}):
        validate(parse_config(small_config(tmp_path, **cae(**params))))


@pytest.mark.parametrize(("objective", "field"), [
    ({"name": "dcor", "alpha": 1e300}, "objective.alpha"),
    ({"name": "pe_loss", "alpha": 1e300}, "objective.alpha"),
    ({"name": "mid", "lambda": 1e300}, "objective.lambda"),
    ({"name": "cae", "lambda": 1e300}, "objective.lambda"),
    ({"name": "cae", "lambda": 0.5, "reconstruction_weight": 1e300}, "objective.reconstruction_weight"),
    ({"name": "gafm", "sigma": 1e300, "delta": 0.1, "gamma": 1.0}, "objective.sigma"),
    ({"name": "gafm", "sigma": 0.1, "delta": 0.1, "gamma": 1e300}, "objective.gamma"),
])
def test_an_objectives_loss_weight_that_overflows_is_refused_naming_it(
        tmp_path: Path, objective: dict[str, Any], field: str) -> None:
    """dcor with alpha = 1e300 (pe_loss, mid alike) validated, then failed at train step 0 with
    "the loss of train step 0 is inf: the label party's model diverged", naming no field."""
    over = {"model": {"kind": "mlp", "layers": [16, 8], "cut_layer": 2, "top": "none",
                      "aggregation": "sum"}} if objective["name"] == "gafm" else {}
    message = refusal(tmp_path, objective=objective, **over)
    assert f"{field}: Input should be less than or equal to 1000000" in message, message


def test_a_diverged_penalty_objective_names_its_weight(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A loss that overflows under a penalty objective names the weight field with the divergence."""
    import numpy as np
    import torch

    from label_party.objectives import dcor
    from label_party.schedule import Batch, Phase
    from label_party.trainer import LabelPartyTrainer, NonFiniteStep

    monkeypatch.setattr(dcor, "distance_correlation",
                        lambda activation, labels, squared: torch.tensor(1e35))
    cfg = parse_config(small_config(tmp_path, objective={"name": "dcor", "alpha": 1e6}))
    trainer = LabelPartyTrainer(cfg, np.arange(8) % 2, 2, {1: (4,), 2: (4,)})
    acts = {k: torch.ones(8, 4) * k for k in (1, 2)}
    with pytest.raises(NonFiniteStep) as err:
        trainer.train_step(Batch(Phase.TRAIN, 0, 0, np.arange(8)), acts)
    assert str(err.value).endswith("the label party's model diverged (the parties' activations "
                                   "are at most 2 in size); objective.alpha = 1e+06 weighs a term "
                                   "of its loss: a smaller weight may keep it finite"), str(err.value)


@pytest.mark.parametrize(("override", "line"), [
    ({"defense": [{"name": "laplace", "b": -1}]},
     "defense[0].b: Input should be greater than 0 (got -1)"),
    ({"attacker": {"attacks": [{"name": "clustering", "n_init": 0}]}},
     "attacker.attacks[0].n_init: Input should be greater than or equal to 1 (got 0)"),
    ({"objective": {"name": "dcor", "alpha": -1.0}},
     "objective.alpha: Input should be greater than or equal to 0 (got -1.0)"),
    ({"protection": {"name": "antigan", "parties": [1], "params": {"lambda_obf": "x"}}},
     "protection.params.lambda_obf: 'x' is text; give a number (TOML: 4 or 0.5, not \"4\") "
     "(got 'x')"),
    ({"dataset": {"name": "synthetic_ctr", "params": {"rows": -1}}, "features": {"ratios": [1, 1]}},
     "dataset.params.rows: Input should be greater than or equal to 1 (got -1)"),
])
def test_a_plugin_parameter_error_shows_the_value_given(tmp_path: Path, override: dict[str, Any],
                                                        line: str) -> None:
    """A plug-in's parameter error said the field and the sentence but not the value, where a
    config field's says '(got VALUE)'."""
    assert line in refusal(tmp_path, **override)


@pytest.mark.parametrize(("override", "line"), [
    ({"training": {"batchsize": 8}}, "training.batchsize: Extra inputs are not permitted (got 8) "
     "(did you mean 'batch_size'? allowed keys: batch_size, epochs, eval_interval, max_steps"),
    ({"trainin": {"epochs": 1}}, "trainin: Extra inputs are not permitted (did you mean "
     "'training'? allowed keys: run, dataset, features, model, training, topology, objective"),
    ({"training": {"optimizers": {"1": {"nmae": "sgd"}}}}, "training.optimizers.1.nmae: Extra "
     "inputs are not permitted (got 'sgd') (did you mean 'name'? allowed keys: name, lr, momentum"),
    ({"threat": {"parties": {"1": {"curiuos": True}}}},
     "threat.parties.1.curiuos: Extra inputs are not permitted (got True) (did you mean 'curious'?"),
    ({"objective": {"name": "dcor", "alfa": 1.0}},
     "objective.alfa: Extra inputs are not permitted (got 1.0) (did you mean 'alpha'? allowed keys: alpha, "
     "squared)"),
    ({"objective": {"name": "cae", "lamda": 1.0}},
     "objective.lamda: Extra inputs are not permitted (got 1.0) (did you mean 'lambda'?"),
    ({"defense": [{"name": "marvell", "s": 1.0, "tol_": 2}]},
     "defense[0].tol_: Extra inputs are not permitted (got 2) (did you mean 'tol'? allowed keys: s, "
     "uv_choice"),
    ({"attacker": {"attacks": [{"name": "clustering", "scop": "epoch"}]}},
     "attacker.attacks[0].scop: Extra inputs are not permitted (got 'epoch') (did you mean 'scope'?"),
    ({"attacker": {"attacks": [{"name": "norm", "scope": "epoch"}]}},
     "attacker.attacks[0].scope: Extra inputs are not permitted (got 'epoch') (no parameter is "
     "allowed here)"),
    ({"dataset": {"name": "breast_cancer", "params": {"path": "x"}}},
     "dataset.params.path: Extra inputs are not permitted (got 'x') (no parameter is allowed "
     "here)"),
])
def test_an_unknown_key_names_the_nearest_allowed_key(tmp_path: Path, override: dict[str, Any],
                                                      line: str) -> None:
    """An unknown key said only "Extra inputs are not permitted": a typo (batchsize, alfa,
    curiuos) now gets the nearest allowed key and the keys its table allows."""
    assert line in refusal(tmp_path, **override)


@pytest.mark.parametrize(("override", "line"), [
    ({"training": {"optimizer": {"name": "adam", "lr": 1e300}}},
     "training.optimizer.lr: Input should be less than or equal to 1e+30 (got 1e+300)"),
    ({"training": {"optimizer": {"name": "sgd", "lr": 0.1, "weight_decay": 1e300}}},
     "training.optimizer.weight_decay: Input should be less than or equal to 1e+30"),
    ({"training": {"optimizers": {"label": {"name": "adam", "lr": 1e39}}}},
     "training.optimizers.label.lr: Input should be less than or equal to 1e+30"),
    ({"objective": {"name": "cae", "lambda": 0.5, "lr": 1e300}},
     "objective.lr: Input should be less than or equal to 1e+30"),
    ({"objective": {"name": "mid", "lambda": 0.1, "lr": 1e300}},
     "objective.lr: Input should be less than or equal to 1e+30"),
    ({"attacker": {"attacks": [{"name": "model_completion", "lr": 1e300}]}},
     "attacker.attacks[0].lr: Input should be less than or equal to 1e+30"),
])
def test_a_learning_rate_that_overflows_is_refused_naming_it(
        tmp_path: Path, override: dict[str, Any], line: str) -> None:
    """training.optimizer.lr = 1e300 validated, then every process stopped at its first update
    with a traceback ending in torch's "RuntimeError: value cannot be converted to type float
    without overflow" (weight_decay = 1e300 alike); learning rates and weight decays are now at
    most 1e30, refused at validation naming the field."""
    assert line in refusal(tmp_path, **override)


def test_a_non_finite_activation_is_blamed_on_its_party_not_measured() -> None:
    """In process (no codec refuses it on receipt), lr = 1e30 on every party failed with "the
    label party's model diverged (the parties' activations are at most nan in size)"."""
    import torch

    from label_party.trainer import non_finite_step

    error = non_finite_step(1, math.nan, {1: torch.ones(4, 2), 2: torch.full((4, 2), math.nan)})
    assert str(error) == ("the loss of train step 1 is nan: passive party 2's activation is not "
                          "finite (NaN or Inf): its bottom model diverged"), str(error)
    assert error.party_id == 2


def test_synthetic_images_too_large_to_hold_are_refused_at_validation(tmp_path: Path) -> None:
    """Every synthetic_images bound held alone (2,000,000 rows of 16 × 512 × 512), so a run
    validated, then stopped with numpy's traceback "Unable to allocate 15.3 TiB"; the images'
    size is now bounded at validation, naming the fields and the rows allowed."""
    params = {"rows": 2_000_000, "channels": 16, "height": 512, "width": 512}
    message = refusal(tmp_path, dataset={"name": "synthetic_images", "params": params},
                      features={"passive": [[0, 256], [256, 512]]}, model={"kind": "cnn"},
                      training={"batch_size": 2}, topology={"max_message_mb": 1024})
    assert ("dataset.params: rows × channels × height × width = 2,000,000 × 16 × 512 × 512 = "
            "8,388,608,000,000 float32 pixels take 31,250 GiB; allowed: at most 4,294,967,296 "
            "(16 GiB), so at most 1,024 rows of this image size") in message, message
    validate(parse_config(small_config(  # CIFAR's shape, as bench uses it
        tmp_path, dataset={"name": "synthetic_images", "params": {"rows": 600}},
        features={"passive": [[0, 16], [16, 32]]}, model={"kind": "cnn"})))


@pytest.mark.parametrize(("value", "line"), [
    (1e300, "threat.parties.1.backdoor.trigger_value: Input should be less than or equal to "
            "3.40282e+38 (got 1e+300)"),
    (-1e300, "threat.parties.1.backdoor.trigger_value: Input should be greater than or equal to "
             "-3.40282e+38 (got -1e+300)"),
])
def test_a_backdoor_trigger_beyond_float32_is_refused(tmp_path: Path, value: float,
                                                      line: str) -> None:
    """trigger_value = 1e300 validated, then the malicious party stopped at its first triggered
    batch with a traceback ending in torch's "value cannot be converted to type float without
    overflow" (exit 1); a trigger must be a float32 value, refused at validation otherwise."""
    assert line in refusal(tmp_path, threat={"parties": {"1": {"backdoor": {"trigger_value": value}}}})


def test_a_subset_given_as_its_model_is_taken_as_a_table_is() -> None:
    """The Python API builds configs from models too: a SubsetConfig was refused as 'not a
    subset' once the text, boolean and list forms got their own sentence."""
    from splitleak.config import DatasetConfig, SubsetConfig

    made = DatasetConfig(name="breast_cancer", subset=SubsetConfig(fraction=0.1, seed=7))
    assert made.subset == DatasetConfig(name="breast_cancer",
                                        subset={"fraction": 0.1, "seed": 7}).subset
