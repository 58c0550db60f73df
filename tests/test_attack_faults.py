"""An attack of one's own that raises, or returns what the metric cannot read (not an
AttackResult, another shape, NaN scores), stops the analysis in one sentence naming it (a
PluginError: exit 2), never a traceback nor a figure computed from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attacker.analysis.answers import AttackError
from attacker.analysis.leak import evaluate_batch
from attacker.attacks.base import Attack, AttackParams, AttackResult, SideKnowledge
from tests.conftest import scaled, small_config, write_config
from tests.plugin_package import install


class FaultParams(AttackParams):
    fault: str = ""


class Faulty(Attack):
    """Scores each row by its first coordinate, or breaks in the way `fault` names."""

    name = "faulty"
    family = "label_inference"
    side_knowledge = "none"
    Params = FaultParams
    params: FaultParams

    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        fault = self.params.fault
        if fault == "raises":
            raise RuntimeError("no scores")
        scores = gradients[:, 0].astype(np.float64)
        excluded = np.zeros(len(scores), dtype=bool)
        if fault == "list":
            return [1.0, 2.0]  # type: ignore[return-value]
        if fault == "nan":
            scores[2] = np.nan
        if fault == "nan excluded":  # a row it leaves out is not read
            scores[2], excluded[2] = np.nan, True
        if fault == "nan, one class kept":  # every positive left out: no AUC, nothing read
            scores[0], excluded[1::2] = np.nan, True
        return AttackResult({"short": scores[1:], "2d": scores[:, None]}.get(fault, scores),
                            excluded)


SAYS = {
    "raises": "__call__() raised RuntimeError: no scores (at tests/test_attack_faults.py:",
    "list": "__call__() returned a list; it must return an AttackResult",
    "nan": "__call__() returned 1 NaN value(s) of the 6 the metric reads",
    "short": "__call__() returned values as an array of dtype float64 and shape [5]; it must be a "
             "numeric array of one value per row of the batch [6]",
    "2d": "__call__() returned values as an array of dtype float64 and shape [6, 1]",
}
GRADIENTS = np.arange(12, dtype=np.float32).reshape(6, 2)
LABELS = np.array([0, 1, 0, 1, 0, 1])


@pytest.mark.parametrize("fault", sorted(SAYS))
def test_a_broken_attack_is_named(fault: str) -> None:
    """Before: the attack's own traceback, or 'AttributeError: 'list' object has no attribute
    'skip_reason'', or a ValueError ('attack scores contain NaN') naming no attack."""
    attack = Faulty(FaultParams(fault=fault))
    with pytest.raises(AttackError) as raised:
        evaluate_batch(attack, GRADIENTS, LABELS, np.random.default_rng(0))
    said = str(raised.value)
    assert said.startswith("attack 'faulty' (") and "test_attack_faults.Faulty): " in said, said
    assert SAYS[fault] in said


def test_nan_in_a_row_it_excludes_is_not_read() -> None:
    leak = evaluate_batch(Faulty(FaultParams(fault="nan excluded")), GRADIENTS, LABELS,
                          np.random.default_rng(0))
    assert leak.auc is not None and leak.auc.n_rows == 5


def test_nan_in_a_batch_left_with_one_class_is_skipped_as_before() -> None:
    """A leak AUC of one class is not computed, so its scores are not read: the batch is
    skipped (as before the answer checks), not the analysis stopped."""
    leak = evaluate_batch(Faulty(FaultParams(fault="nan, one class kept")), GRADIENTS, LABELS,
                          np.random.default_rng(0))
    assert leak.auc is None and leak.skip_kind == "side_knowledge"


BOOM = """from tests.test_attack_faults import Faulty


class Boom(Faulty):
    name = "boom"
    def __call__(self, gradients, side):
        raise RuntimeError("attack boom")
"""


def test_a_run_and_attacker_analyze_name_an_installed_attack_that_raises(tmp_path: Path) -> None:
    """The training is kept and the run says how to analyse it again (exit 2); `attacker
    analyze` says the same sentence. Before: a traceback from the analysis, exit 1."""
    env = install(tmp_path / "site", "boomplugin", BOOM,
                  {"splitleak.attacks": {"boom": "boomplugin:Boom"}})
    config = write_config(tmp_path, small_config(tmp_path, attacker={"attacks": ["boom"]},
                                                 training={"max_steps": 2}))
    said = "attack 'boom' (splitleak.attacks entry point 'boomplugin:Boom' of package " \
           "'boomplugin'): __call__() raised RuntimeError: attack boom (at boomplugin/__init__.py:7)"
    run = subprocess.run([sys.executable, "-m", "orchestration", "run", str(config),
                          "--in-process", "--no-progress"], env=env, capture_output=True,
                         text=True, timeout=scaled(300))
    out = " ".join((run.stdout + run.stderr).split())
    assert run.returncode == 2, out
    assert "Traceback" not in out and f"training finished, but its analysis stopped: {said}" in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "label_party" / "outcome.json").is_file()
    again = subprocess.run([sys.executable, "-m", "attacker", "analyze", str(run_dir)], env=env,
                           capture_output=True, text=True, timeout=scaled(300))
    out = " ".join((again.stdout + again.stderr).split())
    assert again.returncode == 2 and "Traceback" not in out and said in out, out


class NoCheck(Faulty):
    name = "nocheck"

    @classmethod
    def check_config(cls, cfg: object) -> None:
        raise RuntimeError("no check")


def test_an_attack_whose_config_check_raises_is_named(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """Every registered attack's check_config runs for every config: one of one's own that
    raised stopped `splitleak validate` (and every run) with its traceback, exit 1."""
    from attacker.attacks import ATTACKS
    from attacker.attacks.checks import check_attacks
    from splitleak.config import ConfigError, parse_config

    monkeypatch.setitem(ATTACKS._entries, "nocheck", NoCheck)
    with pytest.raises(ConfigError, match=r"attack 'nocheck' \(.*NoCheck\): check_config\(\) "
                                          r"raised RuntimeError: no check \(at tests/"):
        check_attacks(parse_config(small_config(tmp_path)), 2)


class NoInit(Faulty):
    def __init__(self, params: FaultParams) -> None:
        raise RuntimeError("no state")


def test_an_attack_whose_init_raises_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: its traceback from `splitleak validate` and `attacker analyze --attacks`."""
    from attacker.attacks import ATTACKS, build_attack
    from splitleak.config import ConfigError

    monkeypatch.setitem(ATTACKS._entries, "noinit", NoInit)
    with pytest.raises(ConfigError, match=r"attack 'noinit' \(.*NoInit\): __init__\(\) raised "
                                          r"RuntimeError: no state \(at tests/"):
        build_attack("noinit", {})
