"""Every shipped experiment file parses; the built-in ones also pass the full pre-start checks;
every example sweep resolves to points that pass them too."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from label_party.validate import check_chain
from orchestration.sweep.command import sweep_points
from orchestration.sweep.spec import load_sweep
from passive_party.protection import check_protection
from splitleak.config import load_config
from splitleak.datasets import DATASETS
from splitleak.validation import check_core

ROOT = Path(__file__).parent.parent / "examples"
SWEEPS = sorted(p for p in ROOT.rglob("*.toml") if "sweep" in tomllib.loads(p.read_text()))
EXAMPLES = sorted(set(ROOT.rglob("*.toml")) - set(SWEEPS))
NEEDS_FILE = {"criteo_file.toml", "adult.toml", "adult_dp.toml", "cifar10-none.toml",
              "cifar10-none-active.toml", "cifar10-kdk.toml", "cifar10-kdk-active.toml",
              "cifar10-resnet18.toml"}
DATA = ROOT / "data"  # one experiment per file loader on a file the user gives (docs/data.md)
FILE_LOADERS = {name for name in DATASETS.names() if "path" in DATASETS.get(name).Params.model_fields}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid(path: Path) -> None:
    cfg = load_config(path)
    check_chain(cfg)
    check_protection(cfg)
    if path.name not in NEEDS_FILE and path.parent != DATA:
        check_core(cfg)


REPRODUCTIONS = {"li_tradeoff.toml", "gafm_table2.toml", "kdk_grid.toml"}


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 4
    assert {p.name for p in SWEEPS} >= REPRODUCTIONS | {"speedup.toml"}
    assert {ROOT / "wan" / "sweep.toml", ROOT / "reconstruction" / "sweep.toml"} <= set(SWEEPS)
    # the studies that used to be scripts: sweep files plus `splitleak compare`
    assert {ROOT / "threat" / "sweep.toml", ROOT / "defenses" / "plugins_default.toml",
            ROOT / "defenses" / "plugins_digits.toml"} <= set(SWEEPS)


def test_every_file_loader_has_an_example() -> None:
    examples = {p.stem: load_config(p) for p in DATA.glob("*.toml")}
    assert set(examples) == FILE_LOADERS
    assert all(cfg.dataset.name == name for name, cfg in examples.items())


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_example_sweep_is_valid(path: Path, tmp_path: Path) -> None:
    sweep = load_sweep(path)
    points = sweep_points(sweep, path, tmp_path / sweep.sweep.name)
    if path.name in REPRODUCTIONS:  # a paper's comparison: every setting, several seeds
        assert len(points) >= 27 and len({p.setting for p in points}) >= 4
    elif path.name == "tiny.toml":  # docs/api.md's worked example: the smallest comparison
        assert [p.setting for p in points] == ["none", "marvell, defense.0.s=4.0"]
    else:  # a measuring sweep (speedup, wan): small, but points to run side by side
        assert len(points) >= 4 and len({p.setting for p in points}) >= 2


def test_vflair_tdcs_refuses_what_is_not_a_finished_vflair_sweep(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """examples/vflair/README.md's `python examples/vflair/tdcs.py SWEEP_DIR` ended in a traceback
    (IndexError, ValueError, KeyError) without an argument, on a directory that is no sweep, and
    on a sweep whose MP* point (no defense, clean scenario) had not finished."""
    import importlib.util

    from tests.conftest import tiny_sweep_file

    spec = importlib.util.spec_from_file_location("tdcs", ROOT / "vflair" / "tdcs.py")
    assert spec is not None and spec.loader is not None
    tdcs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tdcs)
    with pytest.raises(SystemExit) as exited:
        tdcs.cli([])
    assert exited.value.code == 2 and "required: sweep_dir" in capsys.readouterr().err
    assert tdcs.cli([str(tmp_path)]) == 2
    assert "is not a sweep directory" in capsys.readouterr().err
    from orchestration.sweep.index import SweepIndex

    path = tiny_sweep_file(tmp_path)
    sweep = load_sweep(path)
    sweep_dir = tmp_path / "sweep"
    SweepIndex(sweep_dir, sweep_points(sweep, path, sweep_dir), "local").write()  # all pending
    assert tdcs.cli([str(sweep_dir)]) == 2
    assert "no finished point of variant 'none' in the clean scenario" in capsys.readouterr().err
