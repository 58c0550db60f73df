"""Plug-ins from a package of one's own, installed outside the repository: found through the
`splitleak.<kind>s` entry points in every process, and refused in one sentence when broken."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MODULE = '''
import numpy as np
import torch
from pydantic import Field
from attacker.attacks.base import Attack, AttackResult
from label_party.defenses.base import Defense, DefenseParams

class MaxCoord(Attack):
    name = "max_coord"
    family = "label_inference"
    side_knowledge = "none"
    def __call__(self, gradients, side):
        rows = gradients.reshape(gradients.shape[0], -1)
        return AttackResult(np.abs(rows).max(axis=1), np.zeros(rows.shape[0], dtype=bool))

class ShakeParams(DefenseParams):
    sigma: float = Field(gt=0.0)

class Shake(Defense):
    name = "shake"
    Params = ShakeParams
    def __call__(self, cut_gradient, ctx):
        return cut_gradient

class NoCall(Attack):
    name = "nocall"
    family = "label_inference"
    side_knowledge = "none"

class NoFamily(Attack):
    name = "nofamily"
    side_knowledge = "none"
    __call__ = MaxCoord.__call__
'''

PROBE = '''
from attacker.attacks import ATTACKS
from label_party.defenses import DEFENSES
from splitleak.config import ConfigError
try:
    print("ok", ATTACKS.get("max_coord").__name__, DEFENSES.get("shake").__name__)
except ConfigError as err:
    print("refused", err)
'''


def installed(tmp_path: Path, entry_points: str) -> dict[str, str]:
    """An environment whose PYTHONPATH holds a plug-in package declaring `entry_points`."""
    package = tmp_path / "pkg"
    (package / "myplugins").mkdir(parents=True)
    (package / "myplugins" / "__init__.py").write_text(MODULE)
    (package / "myplugins" / "broken.py").write_text("import module_that_does_not_exist\n")
    (package / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "myplugins"\nversion = "0.1"\n' + entry_points)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(package)], check=True)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}


def probe(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


GOOD = ('[project.entry-points."splitleak.attacks"]\nmax_coord = "myplugins:MaxCoord"\n'
        '[project.entry-points."splitleak.defenses"]\nshake = "myplugins:Shake"\n')


def test_an_installed_attack_and_defense_are_found(tmp_path: Path) -> None:
    assert probe(installed(tmp_path, GOOD)) == "ok MaxCoord Shake"


@pytest.mark.parametrize(("entry", "says"), [
    ('bad = "myplugins.broken:X"', "cannot be imported: ModuleNotFoundError"),
    ('norm = "myplugins:MaxCoord"', "the name 'norm' is already taken by attacker.attacks.norm"),
    ('nocall = "myplugins:NoCall"', "NoCall does not implement __call__"),
    ('nofamily = "myplugins:NoFamily"', "does not set the class attribute(s) family"),
    ('other = "myplugins:MaxCoord"', "MaxCoord.name is 'max_coord'; it must be the entry point's"),
])
def test_a_broken_installed_plugin_is_refused_in_one_sentence(tmp_path: Path, entry: str,
                                                              says: str) -> None:
    first = 'max_coord = "myplugins:MaxCoord"\n'
    entries = GOOD.replace(first, f"{first}{entry}\n")
    out = probe(installed(tmp_path, entries))
    assert out.startswith("refused attack ") and "of package 'myplugins'" in out and says in out


def test_attacker_analyze_refuses_a_broken_installed_plugin_in_one_line(tmp_path: Path) -> None:
    """The registry's refusal is a bad input to every entry point: `attacker analyze --attacks`
    printed a traceback for it."""
    env = installed(tmp_path, GOOD.replace('max_coord = "myplugins:MaxCoord"\n',
                                           'max_coord = "myplugins:MaxCoord"\n'
                                           'bad = "myplugins.broken:X"\n'))
    done = subprocess.run([sys.executable, "-m", "attacker", "analyze", str(tmp_path / "no-run"),
                           "--attacks", "max_coord"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "cannot be imported" in done.stderr + done.stdout


def test_one_scan_of_the_installed_distributions_serves_every_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each registry scanned every installed distribution on its first lookup: five scans
    (and a sixth for the plug-in groups) per process, ~10 ms."""
    import splitleak.registry
    from splitleak.plugins import plugin_groups
    from splitleak.registry import Registry, installed_entry_points

    scans = []
    scan = splitleak.registry.entry_points
    monkeypatch.setattr(splitleak.registry, "entry_points", lambda: scans.append(1) or scan())
    installed_entry_points.cache_clear()
    try:
        for kind in ("attack", "defense", "objective", "dataset", "protection"):
            assert Registry(kind).names() == []  # no package here declares any
        assert [group.name for group in plugin_groups.__wrapped__()] == \
            ["attacks", "objective and defense chain", "protection"]
        assert len(scans) == 1
    finally:
        installed_entry_points.cache_clear()
