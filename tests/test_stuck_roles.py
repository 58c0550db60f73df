"""A plug-in of one's own that never returns stops the run within the step deadline (plus
splitleak.watchdog.STUCK_GRACE), named with the function and file:line it is stuck in; the
checkpoints stay and `--resume` finishes the run once the plug-in is fixed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from splitleak.watchdog import STUCK_GRACE
from tests.conftest import scaled, small_config, write_config
from tests.plugin_package import ROOT, install

pytestmark = pytest.mark.slow

# Each plug-in hangs from its STUCK_FROM-th call on while the variable is set (unset: fixed).
STUCK = '''
import os, time
from label_party.defenses.base import Defense, DefenseParams
from label_party.objectives.cross_entropy import CrossEntropy


def _hang(calls):
    if calls >= int(os.environ.get("STUCK_FROM", 10**9)):
        while True:
            time.sleep(0.05)


class Hang(Defense):
    name = "hang"
    Params = DefenseParams
    def __call__(self, cut_gradient, ctx):
        _hang(ctx.step)
        return cut_gradient


class Stall(CrossEntropy):
    name = "stall"
    calls = 0
    def cut_gradients(self, activations, own, sample_ids, labels, class_gradients=False):
        _hang(self.calls)  # the train step's index: the eval steps call predict
        self.calls += 1
        return super().cut_gradients(activations, own, sample_ids, labels, class_gradients)
'''
ENTRIES = {"splitleak.defenses": {"hang": "stuckplugins:Hang"},
           "splitleak.objectives": {"stall": "stuckplugins:Stall"}}
DEADLINE = 2.0  # s: topology.step_deadline_s of these runs (not scaled: it is what is timed)
FROM = 4  # the plug-in's call that never returns


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return install(tmp_path_factory.mktemp("site"), "stuckplugins", STUCK, ENTRIES)


def _run(env: dict[str, str], *args: str, stuck: bool) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "orchestration", *args, "--no-progress"],
                          env={**env, **({"STUCK_FROM": str(FROM)} if stuck else {})}, cwd=ROOT,
                          capture_output=True, text=True, timeout=scaled(120))
    return done.returncode, " ".join((done.stdout + done.stderr).split()), time.monotonic() - started


@pytest.mark.parametrize(("section", "named", "resume"), [
    ({"defense": [{"name": "hang"}]},
     "defense 'hang' (splitleak.defenses entry point 'stuckplugins:Hang' of package "
     "'stuckplugins'), in _hang() at stuckplugins/__init__.py:", True),
    ({"objective": {"name": "stall"}},
     "objective 'stall' (splitleak.objectives entry point 'stuckplugins:Stall' of package "
     "'stuckplugins'), in _hang() at stuckplugins/__init__.py:", False),  # resumes as the defense's does
])
def test_a_stuck_label_party_plugin_stops_the_run_named_and_resumes(
        tmp_path: Path, env: dict[str, str], section: dict, named: str, resume: bool) -> None:
    """Before: the label party's event loop blocked, the parties waited on it, the orchestrator
    saw live processes, and the run never ended nor said why."""
    config = write_config(tmp_path, small_config(
        tmp_path, training={"batch_size": 32, "epochs": 1, "max_steps": 8, "eval_interval": 100,
                            "checkpoint_every": 2},
        topology={"passive_parties": 2, "step_deadline_s": DEADLINE,
                  "join_deadline_s": scaled(60), "tls": False},
        attacker={"attacks": ["norm"]}, **section))
    code, said, seconds = _run(env, "run", str(config), stuck=True)
    assert code == 2, said  # a plug-in's fault, as one that raises
    assert f"run failed: the label party is stuck at TRAIN step {FROM}: {named}" in said, said
    assert f"(topology.step_deadline_s = {DEADLINE:g} s, plus {STUCK_GRACE:g} s grace); fix the " \
           "plug-in, then `splitleak run --resume" in said, said
    assert "passive party" not in said.split("run failed:")[1].split("logs:")[0], said
    (run,) = (tmp_path / "runs").iterdir()
    outcome = json.loads((run / "label_party" / "outcome.json").read_text())
    assert outcome["status"] == "failed" and outcome["culprit"] == "label party"
    assert outcome["step"] == FROM and outcome["checkpoint_step"] == FROM
    assert f"stuck at TRAIN step {FROM}" in outcome["message"]
    # stopped within its deadline, its grace and the start-up of every role (a few seconds)
    assert seconds < scaled(30), seconds
    if not resume:
        return
    code, said, _ = _run(env, "run", "--resume", str(run), stuck=False)  # the plug-in fixed
    assert code == 0, said
    outcome = json.loads((run / "label_party" / "outcome.json").read_text())
    assert outcome["status"] == "ok" and outcome["resumed_from"] == FROM
