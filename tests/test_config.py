"""Config validation: bad files exit 2 naming the field; the resolved config round-trips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from splitleak.config import ConfigError, load_config, parse_config
from splitleak.validation import validate
from tests.conftest import small_config, write_config


def test_default_config_is_valid_and_hash_is_stable() -> None:
    cfg = load_config(None)
    assert cfg.model.kind == "wide_deep" and cfg.training.batch_size == 1024
    assert cfg.topology.passive_parties == 2
    assert load_config(None).hash == cfg.hash


def test_resolved_config_round_trips_with_same_hash(tmp_path) -> None:
    cfg = parse_config(small_config(tmp_path, defense=[{"name": "iso", "t": 2.0}]))
    path = tmp_path / "resolved.toml"
    path.write_text(cfg.to_toml())
    again = load_config(path)
    assert again == cfg and again.hash == cfg.hash
    assert again.defense[0].params == {"t": 2.0}


@pytest.mark.parametrize(("override", "field", "allowed"), [
    ({"model": {"aggregation": "max"}}, "model.aggregation", "'concat', 'sum' or 'mean'"),
    ({"training": {"loss": "hinge"}}, "training.loss", "'auto', 'bce' or 'ce'"),
    ({"training": {"batch_size": 0}}, "training.batch_size", "greater than 0"),
    ({"model": {"kind": "transformer"}}, "model.kind", "'mlp', 'wide_deep', 'cnn' or 'resnet'"),
    ({"training": {"optimizer": {"name": "lion"}}}, "training.optimizer.name", "'adam'"),
    ({"dataset": {"name": "x", "test_fraction": 1.5}}, "dataset.test_fraction", "less than 1"),
    ({"topology": {"passive_parties": 3}}, "features.passive lists 2 parties", "= 3"),
    ({"model": {"cut_layer": 5}}, "cut_layer=5 exceeds", "2 layers"),
    ({"model": {"top": "none"}}, "aggregation = 'sum'", "top = 'none'"),
    ({"training": {"optimizers": {"7": {"lr": 0.1}}}}, "unknown party ['7']", "label"),
    ({"bogus": 1}, "bogus", "Extra inputs are not permitted"),
])
def test_bad_config_names_field_and_allowed_values(tmp_path, override, field, allowed) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(small_config(tmp_path, **override))
    assert field in str(err.value) and allowed in str(err.value)


def test_features_need_exactly_one_of_ranges_or_ratios(tmp_path) -> None:
    data = small_config(tmp_path)
    data["features"] = {"passive": [[0, 15], [15, 30]], "ratios": [1, 1]}
    with pytest.raises(ConfigError, match="exactly one of"):
        parse_config(data)


def test_wide_deep_needs_label_party_features(tmp_path) -> None:
    with pytest.raises(ConfigError, match="features.label_party"):
        parse_config(small_config(tmp_path, model={"kind": "wide_deep"}))


def test_missing_file_and_bad_toml(tmp_path) -> None:
    with pytest.raises(ConfigError, match="nope.toml does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nseed = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"[run]\nname = 'caf\xe9'\n")  # Latin-1, not UTF-8
    with pytest.raises(ConfigError, match=r"latin.toml: not UTF-8 text \(byte 0xe9 at offset 17\)"):
        load_config(latin)
    with pytest.raises(ConfigError, match="is a directory; give the path of a config TOML file"):
        load_config(tmp_path)
    (tmp_path / "empty.toml").write_text("# only a comment\n")
    with pytest.raises(ConfigError, match=r"empty.toml: it is empty \(it holds no setting\)"):
        load_config(tmp_path / "empty.toml")
    plain = write_config(tmp_path, small_config(tmp_path))
    marked = tmp_path / "bom.toml"  # a byte-order mark first, as some Windows editors save
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert load_config(marked).hash == load_config(plain).hash


@pytest.mark.parametrize(("override", "message"), [
    ({"model": {"aggregation": "max"}}, "model.aggregation"),
    ({"dataset": {"name": "imagenet"}}, "unknown dataset 'imagenet'; allowed: "),
    ({"defense": [{"name": "foo"}]}, "defense[0].name: unknown defense 'foo'; allowed: "),
    ({"features": {"passive": [[0, 15], [15, 99]]}}, "features.passive[1]: range [15, 99)"),
])
def test_cli_exits_2_before_any_process_starts(tmp_path, override, message) -> None:
    path = write_config(tmp_path, small_config(tmp_path, **override))
    for command in (["orchestration.cli", "run", str(path)], ["label_party", "serve", "--config", str(path)]):
        result = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("override", "message"), [
    ({"defense": [{"name": "marvell", "s": -1}]}, "defense[0].s: Input should be greater than 0"),
    ({"defense": [{"name": "marvell", "s": 1, "bogus": 2}]}, "defense[0].bogus: Extra inputs"),
    ({"objective": {"name": "nope"}}, "objective.name: unknown objective 'nope'; allowed: "),
    ({"dataset": {"name": "synthetic_ctr", "params": {"positive_rate": 1.5}}},
     "dataset.params.positive_rate: Input should be less than 1"),
    ({"features": {"ratios": [1, 1]}, "model": {"kind": "cnn"}}, "needs an image dataset"),
])
def test_plugin_parameters_are_checked_before_start(tmp_path, override, message) -> None:
    from label_party.validate import check_chain
    from splitleak.validation import check_core

    cfg = parse_config(small_config(tmp_path, **override))
    with pytest.raises((ConfigError, ValueError)) as err:
        check_core(cfg)
        check_chain(cfg)
    assert message in str(err.value)


def test_a_sweep_file_given_as_an_experiment_says_how_to_run_it(tmp_path: Path) -> None:
    path = tmp_path / "wan.toml"
    path.write_text('[sweep]\nname = "wan"\n\n[[variant]]\nname = "lan"\n')
    with pytest.raises(ConfigError, match=r"sweep file .*splitleak sweep"):
        load_config(path)
    path.write_text('[sweep]\nname = "wan"\n\n[axes]\n"training.epochs" = [1, 2]\n')  # no variant
    with pytest.raises(ConfigError, match=r"is a sweep file .*`splitleak sweep .*wan.toml`"):
        load_config(path)


@pytest.mark.parametrize(("override", "needle"), [
    ({"dataset": {"name": "breast_cancr"}},
     "dataset.name: unknown dataset 'breast_cancr' (did you mean 'breast_cancer'?); allowed: adult"),
    ({"objective": {"name": "dcorr", "alpha": 1.0}},
     "objective.name: unknown objective 'dcorr' (did you mean 'dcor'?); allowed: cae"),
    ({"defense": [{"name": "marvel", "s": 1.0}]},
     "defense[0].name: unknown defense 'marvel' (did you mean 'marvell'?); allowed: discrete_sgd"),
])
def test_a_misspelt_plugin_name_gets_the_nearest_one(tmp_path: Path, override: dict,
                                                     needle: str) -> None:
    """'marvel' was refused with the list of every defense only; the nearest name comes first."""
    with pytest.raises(ConfigError) as err:
        validate(parse_config(small_config(tmp_path, **override)))
    assert needle in str(err.value), str(err.value)
