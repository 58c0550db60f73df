"""A plug-in of one's own that never returns stops the run within the step deadline (plus
splitleak.watchdog.STUCK_GRACE), named with the function and file:line it is stuck in; the
checkpoints stay and `--resume` finishes the run once the plug-in is fixed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from splitleak.watchdog import STALL_TOLERANCE, STUCK_GRACE
from tests.conftest import scaled, small_config, write_config
from tests.plugin_package import ROOT, install

pytestmark = pytest.mark.slow

# Each plug-in hangs from its STUCK_FROM-th call on while the variable is set (unset: fixed).
STUCK = '''
import os, time
from label_party.defenses.base import Defense, DefenseParams
from label_party.objectives.cross_entropy import CrossEntropy
from passive_party.protections.base import Protection


def _hang(calls):
    if "STUCK_FROM" in os.environ and calls >= int(os.environ["STUCK_FROM"]):
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


class Freeze(Protection):
    name = "freeze"
    def __call__(self, images, first_block, seed):
        _hang(10**9)  # from its first call on
'''
ENTRIES = {"splitleak.defenses": {"hang": "stuckplugins:Hang"},
           "splitleak.objectives": {"stall": "stuckplugins:Stall"},
           "splitleak.protections": {"freeze": "stuckplugins:Freeze"}}
DEADLINE = scaled(2.0)  # s: topology.step_deadline_s of these runs (healthy steps must fit it)
FROM = 4  # the plug-in's call that never returns


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return install(tmp_path_factory.mktemp("site"), "stuckplugins", STUCK, ENTRIES)


def _run(env: dict[str, str], *args: str, stuck: bool) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "orchestration", *args, "--no-progress"],
                          env={**env, **({"STUCK_FROM": str(FROM)} if stuck else {})}, cwd=ROOT,
                          capture_output=True, text=True, timeout=scaled(120))
    return done.returncode, " ".join((done.stdout + done.stderr).split())


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
    code, said = _run(env, "run", str(config), stuck=True)
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
    # stopped once its deadline and grace passed (a late tick of a loaded machine aside)
    waited = float(re.search(r"has not returned for ([0-9.]+) s", said)[1])
    # fired at the first tick past the limit; a tick later than STALL_TOLERANCE is not counted
    assert DEADLINE + STUCK_GRACE <= waited < DEADLINE + STUCK_GRACE + 2 * STALL_TOLERANCE, said
    if not resume:
        return
    code, said = _run(env, "run", "--resume", str(run), stuck=False)  # the plug-in fixed
    assert code == 0, said
    outcome = json.loads((run / "label_party" / "outcome.json").read_text())
    assert outcome["status"] == "ok" and outcome["resumed_from"] == FROM


def test_a_stuck_protection_is_named_before_the_party_that_did_not_join(
        tmp_path: Path, env: dict[str, str]) -> None:
    """A protection runs before its party joins: the label party refused the party once
    topology.join_deadline_s passed ("passive party 1 did not join within 12 s"), where it was
    stuck unsaid; the party now says it first, at the same deadline."""
    join = scaled(12)
    config = write_config(tmp_path, small_config(
        tmp_path, dataset={"name": "digits", "test_fraction": 0.2},
        features={"passive": [[0, 4], [4, 8]]},
        model={"kind": "cnn", "channels": [8], "layers": [32], "cut_layer": 1},
        training={"batch_size": 64, "epochs": 1, "max_steps": 2, "eval_interval": 0},
        protection={"name": "freeze", "parties": [1]},
        topology={"passive_parties": 2, "step_deadline_s": DEADLINE, "join_deadline_s": join,
                  "tls": False}))
    code, said = _run(env, "run", str(config), stuck=True)
    assert code == 2, said
    assert "run failed: passive party 1 exited with code 2: passive party 1 is stuck protecting " \
           "its train images: protection 'freeze' (splitleak.protections entry point " \
           "'stuckplugins:Freeze' of package 'stuckplugins'), in _hang() at " \
           "stuckplugins/__init__.py:" in said, said
    assert f"(topology.join_deadline_s = {join:g} s: a party must have joined by then); fix the " \
           "plug-in" in said and "the label party reports: passive party 1 did not join" in said, said


def test_a_stuck_step_of_an_in_process_run_is_named(tmp_path: Path, env: dict[str, str]) -> None:
    """`splitleak run --in-process` hung as the distributed run did, with no deadline at all."""
    config = write_config(tmp_path, small_config(
        tmp_path, training={"batch_size": 32, "epochs": 1, "max_steps": 8, "eval_interval": 100},
        topology={"passive_parties": 2, "step_deadline_s": DEADLINE}, defense=[{"name": "hang"}]))
    code, said = _run(env, "run", str(config), "--in-process", stuck=True)
    assert code == 2, said
    assert f"run failed: the in-process run is stuck at TRAIN step {FROM}: defense 'hang' " \
           "(splitleak.defenses entry point 'stuckplugins:Hang' of package 'stuckplugins'), in " \
           "_hang() at stuckplugins/__init__.py:" in said, said
    assert f"(3 roles' topology.step_deadline_s = {DEADLINE:g} s each, plus {STUCK_GRACE:g} s " \
           "grace); fix the plug-in, then run it again" in said, said
    (run,) = (tmp_path / "runs").iterdir()
    outcome = json.loads((run / "label_party" / "outcome.json").read_text())
    assert outcome["status"] == "failed" and outcome["step"] == FROM
