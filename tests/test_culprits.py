"""The right culprit, in one sentence (issue 13, item 4): a full sidecar is named as the
sidecar, a refusal is logged where it happens and reported as "refused", the orchestrator
names the first process that failed with its own error and stops the run within seconds.
(The stalled label party and the killed sidecar are cells of tests/test_faults.py.)"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from attacker.sidecar.server import serve as serve_sidecar
from splitleak.artifacts.paths import RunDir
from splitleak.config import TopologyConfig, parse_config
from tests.conftest import scaled, small_config, write_config
from tests.live import ScriptedParty, gradient_record, join_request, label_party, record_stream, whole_run
from tests.runs import cli
from tests.test_checkpoints import fresh_run
from tests.test_cli_refusals import _criteo_lines


def test_a_full_sidecar_is_named_as_the_sidecar(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, training={"batch_size": 16, "epochs": 1},
                                    topology={"step_deadline_s": scaled(10)}))
    run = fresh_run(cfg, tmp_path / "run")
    gradients = run.attacker / "gradients"
    gradients.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(gradients)],
                      capture_output=True).returncode:
        pytest.skip("needs a small disk: a tmpfs that root may mount")
    try:
        outcome, errors = asyncio.run(whole_run(cfg, run.root))
    finally:
        subprocess.run(["umount", "-l", str(gradients)], check=False)
    assert outcome["status"] == "failed" and outcome["culprit"] == "attacker sidecar"
    assert outcome["message"].startswith("attacker sidecar failed (reported by passive party 1")
    assert "No space left on device" in outcome["message"]
    assert "attacker sidecar" in str(errors[0])  # the party's own log says the same


def test_a_refused_party_is_reported_as_refused_and_logged_where_refused(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = parse_config(small_config(tmp_path, features={"passive": [[0, 30]]},
                                    topology={"passive_parties": 1, "join_deadline_s": scaled(3)}))
    other = parse_config(small_config(tmp_path, run={"name": "t", "seed": 4},
                                      features={"passive": [[0, 30]]},
                                      topology={"passive_parties": 1}))

    async def go() -> dict:
        async with label_party(cfg, tmp_path / "run") as (serving, outcome):
            async with grpc.aio.insecure_channel(serving.address) as channel:
                party = ScriptedParty(cfg, channel)
                with pytest.raises(grpc.aio.AioRpcError):
                    await party.stub.Join(join_request(other, party.bottom), timeout=scaled(10))
            return await asyncio.wait_for(outcome, scaled(30))

    with caplog.at_level(logging.WARNING, logger="label_party"):
        outcome = asyncio.run(go())
    assert outcome["message"].startswith("passive party 1 was refused: passive party 1 loaded "
                                         "config"), outcome["message"]
    assert "did not join" not in outcome["message"]
    assert any("refused the Join of passive party 1" in r.getMessage() and "config" in r.getMessage()
               for r in caplog.records)


def test_the_sidecar_logs_a_refused_run_id_and_gives_up_saying_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    topology = TopologyConfig(tls=False, join_deadline_s=scaled(1))

    async def go() -> int:
        port_file = tmp_path / "address"
        sidecar = asyncio.ensure_future(serve_sidecar(tmp_path / "run", "127.0.0.1:0", {1}, "r1",
                                                      topology, port_file))
        while not port_file.exists():
            await asyncio.sleep(0.02)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await record_stream(port_file.read_text().strip(), [gradient_record(run_id="r0")])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        return await asyncio.wait_for(sidecar, scaled(30))

    with caplog.at_level(logging.WARNING, logger="attacker"):
        assert asyncio.run(go()) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("refused passive party 1: record of run 'r0'") for m in messages)
    assert any(m.startswith("passive party 1 was refused: record of run 'r0'") for m in messages)


def _log_time(line: str) -> float:
    stamp = " ".join(line.split()[:2])
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.mark.slow
def test_the_first_process_to_fail_is_named_with_its_own_error_and_the_run_stops(
        tmp_path: Path) -> None:
    """Passive party 1 cannot read its columns: the run ends within seconds (not at a
    deadline) and says so with the party's own sentence, not a child stopped by the
    orchestrator."""
    data = tmp_path / "train.txt"
    data.write_text(_criteo_lines(400, bad_line=7))
    config = write_config(tmp_path, small_config(
        tmp_path, dataset={"name": "criteo", "params": {"path": str(data), "vocab_size": 100}},
        features={"ratios": [1, 1]},
        topology={"step_deadline_s": 60, "join_deadline_s": 120, "tls": False}))
    proc = cli("run", str(config), "--no-progress")
    out, _ = proc.communicate(timeout=scaled(240))
    ended = time.time()
    text = " ".join(out.split())
    assert proc.returncode == 2, out  # bad input (a data file), as the party's own code says
    assert re.search(r"run failed: passive party 1 exited with code 2: passive party 1: "
                     r"DatasetError: \S+train.txt, line 7: column 'I2' is 'abc'", text), text
    # no process is reported as ended by the SIGTERM the others got (the temp path may hold "-15")
    assert not re.search(r"(code|signal) -15\b", text) and "SIGTERM" not in text
    run = RunDir(next((tmp_path / "runs").iterdir()))
    failed = next(line for line in (run.logs / "passive_party_1.log").read_text().splitlines()
                  if " ERROR " in line)
    assert ended - _log_time(failed) < scaled(15), "the run was not stopped within seconds"


class _Ended:
    """A child process as the orchestrator sees it once it ended (a stand-in for Popen)."""

    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


def test_a_stalled_party_named_by_the_label_party_leads_the_message(tmp_path: Path) -> None:
    """Party 1 stalled (SIGSTOP): the label party failed the step naming it and sent party 2
    away, which exited first; only then was party 1 stopped. The run names party 1 (at
    920e7e0 it read "passive party 2 exited with code 1")."""
    from orchestration.processes import Child
    from orchestration.run import _failure
    from splitleak.artifacts.outcome import write_outcome

    run = RunDir(tmp_path)
    run.label_party.mkdir()
    write_outcome(run, {"status": "failed", "code": "DEADLINE_EXCEEDED", "party": 1,
                        "culprit": "passive party 1",
                        "message": "passive party 1 sent no activation for TRAIN step 12 within 4 s"})
    log = tmp_path / "party_2.log"
    log.write_text("2026-11-26 07:00:00,000 passive-party-2 ERROR passive party 2: the label party "
                   "ended the stream with ABORTED: the run failed\n")
    children = [Child("label party", _Ended(1), tmp_path / "none.log", exited_at=3.0),
                Child("passive party 1", _Ended(-9), tmp_path / "none.log", stopped=True),
                Child("passive party 2", _Ended(1), log, exited_at=2.0)]
    failure = _failure(children, run)
    assert str(failure).startswith("passive party 1 sent no activation"), failure
    assert "passive party 2" not in str(failure)


def test_a_killed_relay_is_named_not_the_party_behind_it(tmp_path: Path) -> None:
    """[network]: a relay SIGKILLed cuts its party off; the label party concludes that party
    broke the run, and the party exits 1, but the cause is the relay."""
    from orchestration.processes import Child
    from orchestration.run import _failure

    run = RunDir(tmp_path)
    run.label_party.mkdir(parents=True)
    run.outcome.write_text('{"status": "failed", "message": "passive party 2 closed its stream", '
                           '"code": "UNAVAILABLE", "culprit": "passive party 2"}')
    log = tmp_path / "x.log"
    children = [Child("label party", _Ended(1), log), Child("passive party 1", _Ended(0), log),
                Child("passive party 2", _Ended(1), log),
                Child("relay 2", _Ended(-9), log, essential=False, serves=True)]
    failure = _failure(children, run)
    assert failure is not None and failure.culprit == "relay 2"
    assert str(failure).startswith("relay 2 was killed by SIGKILL")
    children[3] = Child("relay 2", _Ended(None), log, essential=False, serves=True)  # alive
    assert _failure(children, run).culprit == "passive party 2"


def test_a_sidecar_ended_by_its_parties_broken_stream_is_not_named(tmp_path: Path) -> None:
    """Once its tapped party's stream broke, the sidecar ends on its own (exit 1, naming that
    stream) a few seconds later, maybe before that party is seen to exit: the run names the
    role that failed, never the sidecar."""
    from orchestration.processes import Child
    from orchestration.run import _failure
    from splitleak.artifacts.outcome import write_outcome

    run = RunDir(tmp_path)
    run.label_party.mkdir()
    sidecar_log = tmp_path / "attacker.log"
    sidecar_log.write_text("2026-11-27 07:00:06,000 attacker ERROR stopped before passive party 1 "
                           "finished streaming: the Record stream of passive party 1 broke before "
                           "it was closed\n")
    log = tmp_path / "none.log"
    sidecar = Child("attacker sidecar", _Ended(1), sidecar_log, exited_at=6.6)
    children = [Child("label party", _Ended(1), log, exited_at=1.0), sidecar,
                Child("passive party 1", _Ended(1), log, exited_at=1.2)]
    assert _failure(children, run).culprit == "label party"  # it failed first, concluding nothing
    write_outcome(run, {"status": "failed", "code": "UNAVAILABLE", "party": 2,
                        "culprit": "passive party 2", "message": "passive party 2 was stopped"})
    children = [Child("label party", _Ended(1), log, exited_at=1.5), sidecar,
                Child("passive party 1", _Ended(None), log),  # not seen to exit yet
                Child("passive party 2", _Ended(130), log, exited_at=1.0)]
    failure = _failure(children, run)
    assert failure.culprit == "passive party 2" and "attacker sidecar" not in str(failure), failure


def test_a_sidecar_told_by_a_failed_party_is_not_named_though_it_exits_first(
        tmp_path: Path) -> None:
    """A party that fails before its tap started now tells the sidecar why, and the sidecar
    ends at once, often before the party is seen to exit: the run names the party, in its own
    words and with its exit code (2: its data file), never the sidecar."""
    from orchestration.processes import Child
    from orchestration.run import _failure
    from splitleak.cli_common import EXIT_PARTY_STOPPED

    run = RunDir(tmp_path)
    run.label_party.mkdir()
    reason = "passive party 1: DatasetError: train.txt, line 7: column 'I2' is 'abc'"
    sidecar_log = tmp_path / "attacker.log"
    sidecar_log.write_text("2026-11-27 07:00:06,000 attacker ERROR stopped before passive party 1 "
                           f"finished streaming: passive party 1 stopped: {reason}\n")
    party_log = tmp_path / "passive_party_1.log"
    party_log.write_text(f"2026-11-27 07:00:06,000 passive-party-1 ERROR {reason}\n")
    children = [Child("label party", _Ended(None), tmp_path / "none.log"),
                Child("attacker sidecar", _Ended(EXIT_PARTY_STOPPED), sidecar_log, exited_at=1.0),
                Child("passive party 1", _Ended(2), party_log, exited_at=1.1)]
    failure = _failure(children, run)
    assert failure.culprit == "passive party 1" and failure.exit_code == 2, failure
    assert str(failure).startswith(f"passive party 1 exited with code 2: {reason}"), failure


def test_a_resumed_process_is_reported_in_its_own_words(tmp_path: Path) -> None:
    """A resume appends to the roles' logs: a refused resume is named by what this attempt
    logged, never by the interrupted attempt's last ERROR line (it said "resume it with
    --resume", the very thing that just failed)."""
    from orchestration.processes import spawn

    log = tmp_path / "label_party.log"
    log.write_text("2026-11-27 07:00:06,000 label-party ERROR training finished: interrupted (the "
                   "run was interrupted at step 40; resume it with --resume)\n")
    child = spawn("label party", ["json.tool", str(tmp_path / "no-such.json")], log)
    child.process.wait(scaled(30))
    reason = child.last_error() or ""
    assert child.returncode == 2 and "no-such.json" in reason, reason
    assert "interrupted" not in child.log_tail(), child.log_tail()
