"""The sweep file: overrides by config path, validation naming the field, points by config hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w

from orchestration.cli import main
from orchestration.sweep.overrides import OverrideError, apply
from orchestration.sweep.points import resolve
from orchestration.sweep.spec import SweepError, parse_sweep
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import write_config as write_run_config
from splitleak.config import load_config, parse_config
from splitleak.validation import validated
from tests.conftest import small_config, write_config

BASE = {"run": {"seed": 0}, "defense": [{"name": "marvell", "s": 1.0}],
        "objective": {"name": "cross_entropy"}, "training": {"epochs": 2, "batch_size": 64}}


def test_apply_sets_scalars_in_lists_and_tables() -> None:
    out = apply(BASE, "defense.0.s", 4)
    assert out["defense"] == [{"name": "marvell", "s": 4}]
    assert BASE["defense"][0]["s"] == 1.0  # the input is not changed
    assert apply(BASE, "training.epochs", 5)["training"] == {"epochs": 5, "batch_size": 64}
    assert apply(BASE, "dataset.subset.fraction", 0.1)["dataset"] == {"subset": {"fraction": 0.1}}


def test_apply_merges_tables_but_a_different_plugin_replaces() -> None:
    merged = apply(BASE, "training", {"epochs": 3})
    assert merged["training"] == {"epochs": 3, "batch_size": 64}
    same = apply(BASE, "defense.0", {"name": "marvell", "uv_choice": "same"})
    assert same["defense"][0] == {"name": "marvell", "s": 1.0, "uv_choice": "same"}
    other = apply(BASE, "defense.0", {"name": "iso", "t": 2.0})
    assert other["defense"][0] == {"name": "iso", "t": 2.0}  # marvell's s does not linger
    assert apply(BASE, "defense", [])["defense"] == []


@pytest.mark.parametrize("path, message", [
    ("defense.1.s", "defense has 1 entry, so there is no defense.1"),
    ("defense.first.s", "index it by number"),
    ("training.epochs.x", "not a table or list"),
    ("training..epochs", "empty part"),
])
def test_apply_names_what_does_not_fit(path: str, message: str) -> None:
    with pytest.raises(OverrideError, match=message):
        apply(BASE, path, 1)


def _sweep(**sections) -> dict:
    return {"sweep": {"name": "s", **sections.pop("sweep", {})}, **sections}


@pytest.mark.parametrize("data, message", [
    (_sweep(sweep={"bogus": 1}), r"sweep\.bogus"),
    (_sweep(sweep={"name": "a b"}), r"sweep\.name"),
    (_sweep(axes={"defense.0.s": []}), "has no values"),
    (_sweep(axes={"run.seed": [1, 1]}), "repeats a value"),
    (_sweep(sweep={"seeds": [0, 0]}), "repeats a seed"),
    (_sweep(sweep={"seeds": [0]}, axes={"run.seed": [1, 2]}), "both set run.seed"),
    (_sweep(variant=[{"name": "a"}, {"name": "a"}]), "repeated: a"),
    (_sweep(variant=[{"name": "a", "axes": {"x.y": [1]}}], axes={"x.y": [2]}), "in one place"),
    (_sweep(variant=[{"name": "a", "bogus": 1}]), r"variant\.0\.bogus"),
    (_sweep(sweep={"subset": 1.5}), r"sweep\.subset"),
    # a run.output_dir that no point used (each runs in the sweep directory, its config.toml
    # naming the other place): refused, as run.seed is
    (_sweep(set={"run.output_dir": "/tmp/elsewhere"}), r"\[set\] sets run.output_dir, which a "
                                                       "sweep does not use"),
    (_sweep(variant=[{"name": "a", "set": {"run": {"output_dir": "x"}}}]),
     "variant 'a' set sets run.output_dir"),
    (_sweep(variant=[{"name": "a", "axes": {"run.output_dir": ["x", "y"]}}]),
     r"variant 'a' axes sets run.output_dir.*give sweep.output_dir"),
])
def test_sweep_file_errors_name_the_field(data: dict, message: str) -> None:
    with pytest.raises(SweepError, match=message):
        parse_sweep(data, "test.toml")


def test_an_axis_naming_one_number_twice_is_refused() -> None:
    """"defense.0.s" = [1, 1.0] ran Marvell at s = 1 twice under two config hashes (its float
    parameter reads both as 1.0), the comparison listing 'defense.0.s=1' and 'defense.0.s=1.0'
    with the same figures; refused now as a repeated value. A bool is no number here, nor a
    table with another value."""
    with pytest.raises(SweepError, match=r"axis 'defense.0.s' repeats a value: \[1, 1.0\] "
                                         r"\(1 and 1.0 are one number\)"):
        parse_sweep(_sweep(variant=[{"name": "m", "axes": {"defense.0.s": [1, 1.0]}}]))
    with pytest.raises(SweepError, match=r"axis 'defense.0' repeats a value"):
        parse_sweep(_sweep(axes={"defense.0": [{"name": "iso", "t": 2}, {"t": 2.0, "name": "iso"}]}))
    parse_sweep(_sweep(axes={"attacker.enabled": [True, 1], "defense.0.s": [1, 1.5],
                             "defense.0": [{"name": "iso", "t": 2}, {"name": "iso", "t": 3}]}))


@pytest.mark.parametrize("sections, said", [
    ({"set": {"training.epochz": 1}}, r'training.epochz: Extra inputs .* \(set by the sweep '
                                      r'file\'s \[set\] "training.epochz"\)'),
    ({"axes": {"training.optimizer": [{"name": "sgd", "lr": "x"}]}},
     r'training.optimizer.lr: .* \(set by the sweep file\'s \[axes\] "training.optimizer"\)'),
    ({"variant": [{"name": "m", "set": {"defense": [{"name": "marvell"}]},
                   "axes": {"defense.0.s": ["x"]}}]},
     r'defense\[0\].s: .* \(set by the sweep file\'s variant \'m\' axes "defense.0.s"\)'),
])
def test_a_bad_value_names_the_sweep_file_key_that_set_it(
        tmp_path: Path, sections: dict, said: str) -> None:
    """A [set] "training.epochz" = 1 was refused as 'invalid config point 0 (the base config):
    training.epochz: Extra inputs are not permitted', which sent one to the base config file;
    the error now ends naming the sweep file's key that set the field, and where it is."""
    base = parse_config(small_config(tmp_path))
    with pytest.raises(SweepError, match=said):
        resolve(parse_sweep(_sweep(**sections)), base, tmp_path, check=validated)


def test_points_cross_variants_axes_and_seeds(tmp_path: Path) -> None:
    base = parse_config(small_config(tmp_path))
    sweep = parse_sweep(_sweep(
        sweep={"seeds": [0, 1], "subset": 0.5}, set={"training.epochs": 1},
        axes={"training.batch_size": [32, 64]},
        variant=[{"name": "none"},
                 {"name": "marvell", "set": {"defense": [{"name": "marvell"}]},
                  "axes": {"defense.0.s": [0.25, 4.0]}}]))
    points = resolve(sweep, base, tmp_path / "sweeps" / "s", check=validated)
    assert len(points) == 2 * 2 + 2 * 2 * 2  # (none + marvell x 2 s) x 2 batch sizes x 2 seeds
    assert [p.index for p in points] == list(range(len(points)))
    assert len({p.hash for p in points}) == len(points)
    assert all(p.run_dir == tmp_path / "sweeps" / "s" / p.hash for p in points)
    first, last = points[0], points[-1]
    # each axis by its path, as the sweep file wrote it: one name per knob
    assert first.label == "none, training.batch_size=32, seed=0"
    assert first.setting == "none, training.batch_size=32"
    assert last.label == "marvell, training.batch_size=64, defense.0.s=4.0, seed=1"
    assert json.loads(last.axes_json()) == {"training.batch_size": 64, "defense.0.s": 4.0}
    assert last.config.defense[0].params == {"s": 4.0}
    assert last.config.training.epochs == 1 and last.config.dataset.subset.fraction == 0.5
    assert json.loads(last.overrides_json()) == {
        "training.epochs": 1, "defense": [{"name": "marvell"}], "training.batch_size": 64,
        "defense.0.s": 4.0, "run.seed": 1, "dataset.subset": {"fraction": 0.5}}
    # the seed is the only difference between the two points of one setting
    assert {p.seed for p in points if p.setting == last.setting} == {0, 1}


def test_a_bad_point_names_itself_and_the_field(tmp_path: Path) -> None:
    base = parse_config(small_config(tmp_path))
    bad_axis = parse_sweep(_sweep(variant=[{"name": "m", "set": {"defense": [{"name": "marvell"}]},
                                            "axes": {"defense.0.s": [1.0, -1.0]}}]))
    with pytest.raises(SweepError, match=r"point 1 \(variant 'm'; defense.0.s=-1.0\).*s: Input should "
                                         "be greater than 0"):
        resolve(bad_axis, base, tmp_path, check=validated)
    schema = parse_sweep(_sweep(set={"training.batch_size": 0}))
    with pytest.raises(SweepError, match="training.batch_size"):
        resolve(schema, base, tmp_path, check=validated)
    missing = parse_sweep(_sweep(axes={"defense.0.s": [1.0]}))
    with pytest.raises(SweepError, match="'defense.0.s': defense has 0 entries") as err:
        resolve(missing, base, tmp_path)
    assert str(err.value).startswith("axis 'defense.0.s'"), err.value  # the sweep has no variant
    assert "variant" not in str(err.value), err.value
    same = parse_sweep(_sweep(variant=[{"name": "a"}, {"name": "b", "set": {"training.epochs": 2}}]))
    with pytest.raises(SweepError, match="'a, seed=3' and 'b, seed=3' are the same experiment"):
        resolve(same, base, tmp_path)  # small_config already trains 2 epochs


def test_run_directory_config_keeps_the_hash(tmp_path: Path) -> None:
    """A point's worker reloads config.toml: it must be the same experiment (same hash)."""
    cfg = parse_config(small_config(tmp_path, dataset={"name": "breast_cancer", "subset": 0.3},
                                    defense=[{"name": "marvell", "s": 0.25}]))
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    write_run_config(cfg, run)
    assert load_config(run.config).hash == cfg.hash


def _cli(tmp_path: Path, sweep: dict, *args: str) -> int:
    path = tmp_path / "sweep.toml"
    path.write_text(tomli_w.dumps(sweep))
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(path), "--no-progress", *args])
    return exit_info.value.code


def test_cli_refuses_bad_sweeps_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = write_config(tmp_path, small_config(tmp_path))
    assert _cli(tmp_path, _sweep(sweep={"base": str(base), "seeds": "x"})) == 2
    assert "sweep.seeds" in capsys.readouterr().err
    assert _cli(tmp_path, _sweep(sweep={"base": str(tmp_path / "nope.toml")})) == 2
    assert "nope.toml does not exist" in capsys.readouterr().err
    assert _cli(tmp_path, _sweep(sweep={"base": str(base)}), "--jobs", "0") == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
    assert _cli(tmp_path, _sweep(sweep={"base": str(base)}), "--spread") == 2
    assert "--spread applies only to --engine ray" in capsys.readouterr().err
    assert _cli(tmp_path, _sweep(sweep={"base": str(base)}), "--engine", "inprocess",
                "--address", "host:6379") == 2
    assert "--address applies only to --engine ray" in capsys.readouterr().err
    wan = _sweep(sweep={"base": str(base)}, set={"network.one_way_latency_ms": 25.0})
    assert _cli(tmp_path, wan, "--engine", "inprocess") == 2
    assert "--engine inprocess has no network to shape" in capsys.readouterr().err
    fixed = _sweep(sweep={"base": str(base)}, set={"topology.label_party_address": "127.0.0.1:50999"},
                   axes={"run.seed": [1, 2]})
    assert _cli(tmp_path, fixed, "--jobs", "2") == 2
    assert "fixed port" in capsys.readouterr().err
    (tmp_path / "broken.toml").write_text("[sweep\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(tmp_path / "broken.toml")])
    assert exit_info.value.code == 2 and "not valid TOML" in capsys.readouterr().err
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfe[sweep]\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(tmp_path / "binary.toml")])
    assert exit_info.value.code == 2 and "not UTF-8 text (byte 0xff" in capsys.readouterr().err


def test_an_experiment_given_as_a_sweep_says_how_to_run_it(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    exp = write_config(tmp_path, small_config(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(exp), "--no-progress"])
    text = " ".join(capsys.readouterr().err.split())
    assert exit_info.value.code == 2, text
    assert f"{exp} is an experiment file" in text and f"`splitleak run {exp}`" in text, text
    assert "Extra inputs" not in text, text


def test_a_sweep_directory_in_use_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A second `splitleak sweep` into a directory a first one is sweeping would re-create
    the first's run directories under it: refused, naming the holder."""
    import os

    from splitleak.artifacts.paths import SweepDir
    from splitleak.artifacts.rundir import holding
    from tests.conftest import tiny_sweep_file

    sweep_file = tiny_sweep_file(tmp_path)
    sweep_dir = tmp_path / "sweeps" / "tiny"
    sweep_dir.mkdir(parents=True)
    with holding(SweepDir(sweep_dir).lock, sweep_dir, "sweeping it again"):
        with pytest.raises(SystemExit) as stop:
            main(["sweep", str(sweep_file), "--engine", "inprocess", "--no-progress"])
    assert stop.value.code == 2
    assert (f"{sweep_dir} is in use by another splitleak process (pid {os.getpid()}): let it "
            "end, or stop it, before sweeping it again") in " ".join(capsys.readouterr().err.split())
    assert not any(p.is_dir() and not p.name.startswith(".") for p in sweep_dir.iterdir())


def test_set_run_seed_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match=r"\[set\] sets run.seed, which every point's seed "
                                         r"replaces; give the seeds as sweep.seeds"):
        parse_sweep({"sweep": {"name": "s"}, "set": {"run.seed": 5}})
    with pytest.raises(SweepError, match=r"variant 'a' set sets run.seed"):
        parse_sweep({"sweep": {"name": "s"}, "variant": [{"name": "a", "set": {"run": {"seed": 5}}}]})
