"""A defense of one's own that raises, or returns what the label party cannot send (another
shape or dtype, not a tensor, NaN), stops the run in one sentence naming it, the party and the
step (a PluginError: exit 2), as a broken objective does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from label_party.defenses import DEFENSES, DefenseChain
from label_party.defenses.base import Defense, DefenseError, DefenseParams
from tests.conftest import scaled, small_config, write_config
from tests.plugin_package import install


class FaultParams(DefenseParams):
    fault: str = ""


class Faulty(Defense):
    """Sends the gradient on, or breaks in the way its `fault` parameter names."""

    name = "faulty"
    Params = FaultParams
    params: FaultParams

    def __call__(self, cut_gradient: torch.Tensor, ctx: object) -> torch.Tensor:
        fault = self.params.fault
        if fault == "raises":
            raise RuntimeError("no gradient")
        if fault == "diagnostics":
            ctx.diagnostics["faulty.norm"] = cut_gradient.norm()  # type: ignore[attr-defined]
        if fault == "numpy diagnostics":  # numbers, if numpy's: recorded as the floats they are
            ctx.diagnostics.update(norm=np.float32(0.5), rows=np.int64(4), n=3, x=0.25)  # type: ignore[attr-defined]
        return {"nan": lambda g: g * float("nan"), "shape": lambda g: g[1:],
                "float64": lambda g: g.double(),
                "list": lambda g: g.tolist()}.get(fault, lambda g: g)(cut_gradient)


SAYS = {
    "raises": "__call__() raised RuntimeError: no gradient (at tests/test_defense_faults.py:",
    "nan": "__call__() returned a gradient with NaN or Inf for passive party 2 at train step 7 "
           "(position 1 of the chain) from a finite one",
    "shape": "__call__() returned torch.float32 [3, 5] for passive party 2 at train step 7; it "
             "must return a tensor of its input's shape and dtype (torch.float32 [4, 5])",
    "float64": "__call__() returned torch.float64 [4, 5] for passive party 2",
    "list": "__call__() returned a list for passive party 2 at train step 7",
    # Before: "TypeError: Object of type Tensor is not JSON serializable" writing metrics.jsonl.
    "diagnostics": "ctx.diagnostics['faulty.norm'] is a Tensor for passive party 2 at train step 7; "
                   "each must be a float",
}


@pytest.mark.parametrize("fault", sorted(SAYS))
def test_a_broken_defense_is_named_with_the_party_and_step(monkeypatch: pytest.MonkeyPatch,
                                                           fault: str) -> None:
    monkeypatch.setitem(DEFENSES._entries, "faulty", Faulty)
    chain = DefenseChain([("no_noise", {}), ("faulty", {"fault": fault})], seed=0)
    with pytest.raises(DefenseError) as raised:
        chain.apply(torch.ones(4, 5), torch.tensor([0, 1, 0, 1]), party_id=2, epoch=0, step=7,
                    num_classes=2)
    said = str(raised.value)
    assert said.startswith("defense 'faulty' (") and "test_defense_faults.Faulty): " in said, said
    assert SAYS[fault] in said and "\n" not in said


def test_numpy_numbers_in_diagnostics_are_recorded_as_json_numbers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """np.float32 is a number to numbers.Real but not to the JSON encoder: before, it passed the
    check and stopped the run with 'Object of type float32 is not JSON serializable'."""
    monkeypatch.setitem(DEFENSES._entries, "faulty", Faulty)
    chain = DefenseChain([("faulty", {"fault": "numpy diagnostics"})], seed=0)
    _, diagnostics = chain.apply(torch.ones(4, 5), torch.tensor([0, 1, 0, 1]), party_id=2, epoch=0,
                                 step=7, num_classes=2)
    assert json.loads(json.dumps(diagnostics)) == {"norm": 0.5, "rows": 4.0, "n": 3, "x": 0.25}
    assert type(diagnostics["n"]) is int  # a Python number is recorded as it was


class NoSummary(Faulty):
    def summary(self) -> dict:
        if self.params.fault == "summary list":
            return [1.0]  # type: ignore[return-value]
        raise RuntimeError("no figures")


@pytest.mark.parametrize(("fault", "says"), [
    ("", "summary() raised RuntimeError: no figures (at tests/test_defense_faults.py:"),
    ("summary list", "summary() returned a list; it must return a dict")])
def test_a_defense_whose_summary_breaks_is_named(monkeypatch: pytest.MonkeyPatch, fault: str,
                                                 says: str) -> None:
    """Before: the run trained, then stopped with the summary's own traceback, or wrote a
    list where the report reads the defense's figures."""
    monkeypatch.setitem(DEFENSES._entries, "faulty", NoSummary)
    chain = DefenseChain([("faulty", {"fault": fault})], seed=0)
    chain.apply(torch.ones(4, 5), torch.tensor([0, 1, 0, 1]), party_id=1, epoch=0, step=0,
                num_classes=2)
    with pytest.raises(DefenseError, match=re.escape(says)):
        chain.summary()


def test_a_sound_chain_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DEFENSES._entries, "faulty", Faulty)
    gradient = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    sent, _ = DefenseChain([("faulty", {})], seed=0).apply(
        gradient, torch.tensor([0, 1, 0, 1]), party_id=1, epoch=0, step=0, num_classes=2)
    assert torch.equal(sent, gradient)


SHAKE = '''
from label_party.defenses.base import Defense

class Shake(Defense):
    name = "shake"
    def __call__(self, cut_gradient, ctx):
        raise RuntimeError("defense boom")
'''


def test_an_in_process_run_names_an_installed_defense_that_raises(tmp_path: Path) -> None:
    """Before: a traceback from label_party/defenses/chain.py, exit 1."""
    env = install(tmp_path / "site", "shakeplugin", SHAKE,
                  {"splitleak.defenses": {"shake": "shakeplugin:Shake"}})
    config = write_config(tmp_path, small_config(tmp_path, defense=[{"name": "shake"}],
                                                 training={"max_steps": 2}))
    done = subprocess.run([sys.executable, "-m", "orchestration", "run", str(config),
                           "--in-process", "--no-progress"], env=env, capture_output=True,
                          text=True, timeout=scaled(300))
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert "Traceback" not in said
    assert ("run failed: defense 'shake' (splitleak.defenses entry point 'shakeplugin:Shake' of "
            "package 'shakeplugin'): __call__() raised RuntimeError: defense boom (at "
            "shakeplugin/__init__.py:7)") in said


class NoInit(Faulty):
    def __init__(self, params: FaultParams) -> None:
        raise RuntimeError("no state")


def test_a_defense_whose_init_raises_is_named(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """Before: its traceback from `splitleak validate` (build_defense), exit 1."""
    from label_party.validate import check_chain
    from splitleak.config import ConfigError, parse_config

    monkeypatch.setitem(DEFENSES._entries, "faulty", NoInit)
    says = r"defense 'faulty' \(.*NoInit\): __init__\(\) raised RuntimeError: no state \(at tests/"
    with pytest.raises(ConfigError, match=says):
        check_chain(parse_config(small_config(tmp_path, defense=[{"name": "faulty"}])))
    with pytest.raises(DefenseError, match=says):  # in the run: where each party's is built
        DefenseChain([("faulty", {})], seed=0).defenses(1)
