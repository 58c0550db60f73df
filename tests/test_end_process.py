"""How a console entry point ends: with its code, its cleanup done, also when interrupted twice."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import scaled, small_config, write_config


def test_a_second_ctrl_c_does_not_stop_the_cleanup_half_way() -> None:
    """The second Ctrl-C of a user who stops a sweep lands while the atexit handlers run (the
    zygote's close); it is ignored there, so the handler finishes and nothing is printed."""
    script = textwrap.dedent("""
        import atexit, os, signal, time
        from splitleak.cli_common import end_process

        def cleanup():
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C
            time.sleep(0.2)
            print("cleaned up", flush=True)

        def main():
            atexit.register(cleanup)
            raise KeyboardInterrupt  # the first: the command stops

        end_process(main)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert done.stdout == "cleaned up\n"
    assert "Exception ignored" not in done.stderr and "KeyboardInterrupt" not in done.stderr


def test_a_passive_party_stopped_by_sigterm_says_so(tmp_path: Path) -> None:
    """It died without a word in its log; it still dies of the signal."""
    config = write_config(tmp_path, small_config(tmp_path, topology={"join_deadline_s": 60}))
    party = subprocess.Popen([sys.executable, "-m", "passive_party", "run", "--config",
                              str(config), "--party-id", "1", "--label-party", "127.0.0.1:1",
                              "--run-dir", str(tmp_path / "run")],
                             stderr=subprocess.PIPE, text=True)
    try:
        assert party.stderr is not None
        for line in party.stderr:  # joining: it retries a label party that is not there
            if "computes on" in line:
                break
        time.sleep(0.5)
        party.send_signal(signal.SIGTERM)
        _, err = party.communicate(timeout=scaled(30))
    finally:
        party.kill()
        party.wait()
    assert party.returncode == -signal.SIGTERM, err
    assert "passive party 1: stopped by SIGTERM" in err, err


def stop_party_in_training(tmp_path: Path, data: dict, stop: signal.Signals,
                           *options: str) -> tuple[dict, str, int]:
    """Party 1 as a `passive-party run` process (with `options`), party 2 and the label party in
    this loop; `stop` sent to party 1 at train step 3. The run's outcome, party 1's stderr and
    its exit code."""
    from passive_party.client import run_party
    from splitleak.artifacts.paths import RunDir
    from splitleak.config import parse_config
    from tests.live import label_party, wait_for_train_step

    config = write_config(tmp_path, data)
    cfg = parse_config(data)

    async def go() -> tuple[dict, str, int]:
        async with label_party(cfg, tmp_path / "run") as (serving, outcome):
            party = subprocess.Popen([sys.executable, "-m", "passive_party", "run", "--config",
                                      str(config), "--party-id", "1", "--label-party",
                                      serving.address, "--run-dir", str(tmp_path / "p1"),
                                      *options], stderr=subprocess.PIPE, text=True)
            try:
                other = asyncio.ensure_future(run_party(cfg, 2, serving.address,
                                                        RunDir(tmp_path / "p2")))
                await wait_for_train_step(RunDir(tmp_path / "run"), 3)
                party.send_signal(stop)
                ended = await asyncio.wait_for(outcome, scaled(60))
                _, err = await asyncio.to_thread(party.communicate, timeout=scaled(30))
                await asyncio.gather(other, return_exceptions=True)
            finally:
                party.kill()
                party.wait()
            return ended, err, party.returncode

    return asyncio.run(go())


@pytest.mark.parametrize(("stop", "code", "by"), [(signal.SIGINT, 130, "Ctrl-C (SIGINT)"),
                                                  (signal.SIGTERM, -signal.SIGTERM, "SIGTERM")])
def test_a_passive_party_stopped_in_training_tells_the_label_party(
        tmp_path: Path, stop: signal.Signals, code: int, by: str) -> None:
    """Ctrl-C on a party's host (one party per host) ended it without a word in its log, and
    the run's outcome said the party 'dropped its connection'; now the party tells the label
    party by what it was stopped, and says so itself."""
    data = small_config(tmp_path, training={"epochs": 400, "eval_interval": 0},
                        topology={"join_deadline_s": scaled(60)})
    ended, err, returncode = stop_party_in_training(tmp_path, data, stop)
    assert ended["status"] == "failed", ended
    assert ended["message"] == f"passive party 1 stopped: interrupted on its host by {by}", ended
    assert returncode == code, err
    assert f"passive party 1: stopped by {by}; the label party was told" in err, err


def test_a_stopped_party_still_writes_the_checkpoint_the_label_party_asks_for(tmp_path: Path) -> None:
    """Every host stopped at once (`docker compose down`, one Ctrl-C over every terminal): the
    label party's own stop asks each party for a checkpoint. A party already stopping refused
    it, so the run lost its last checkpoint; it writes it, and stops at the message after."""
    import numpy as np

    from passive_party.client import PartyStopped, StepLoop, StopRequest, load_bottom
    from splitleak.artifacts.paths import RunDir
    from splitleak.codec import encode_tensor
    from splitleak.config import parse_config
    from splitleak.v1 import split_learning_pb2 as pb
    from tests.test_tap import _ScriptedCall

    cfg = parse_config(small_config(tmp_path, features={"passive": [[0, 30]]},
                                    topology={"passive_parties": 1}))
    bottom = load_bottom(cfg, 1)
    batch = pb.Batch(phase=pb.TRAIN, step=0, sample_ids=encode_tensor(np.arange(4)))
    gradient = encode_tensor(np.full((4, *bottom.embedding_shape), 0.01, np.float32))
    written: list[str] = []

    class Call(_ScriptedCall):
        async def write(self, message: pb.PartyMessage) -> None:
            written.append(next(name for name in ("activation", "checkpoint", "failure")
                                if message.HasField(name)))

    call = Call([pb.LabelPartyMessage(next_batch=batch),
                          pb.LabelPartyMessage(cut_gradient=gradient, gradient_step=0,
                                               checkpoint=pb.CheckpointRequest(step=1, batches=1)),
                          pb.LabelPartyMessage(next_batch=batch)], [])
    stop = StopRequest()
    loop = StepLoop(bottom, None, "r", RunDir(tmp_path / "p1"), cfg.wire, stop)
    original = loop._answer

    async def answer_then_stop(batch: pb.Batch) -> pb.PartyMessage:
        stop.why = "interrupted on its host by SIGTERM"  # the signal lands while it computes
        return await original(batch)

    loop._answer = answer_then_stop  # type: ignore[method-assign]
    with pytest.raises(PartyStopped):
        asyncio.run(loop.run(call))
    assert written == ["activation", "checkpoint", "failure"], written  # the ack, then the stop
    assert list((tmp_path / "p1").rglob("*.pt")), "no checkpoint was written"


def test_a_stopped_party_whose_label_party_ends_the_run_first_says_it_was_stopped() -> None:
    """Every host stopped at once: the party writes the label party's stop checkpoint, then the
    label party ends the run (ABORTED, 'interrupted ... resume it'). The party was stopped by
    its signal, not failed: it said 'label party refused or failed' and exited 1."""
    import os

    from passive_party.cli import Stopped, stoppable
    from passive_party.client import PartyError, StopRequest

    request = StopRequest()
    request.training = True

    async def party() -> None:
        os.kill(os.getpid(), signal.SIGINT)  # the host's stop, while the party trains
        while request.why is None:
            await asyncio.sleep(0.01)
        raise PartyError("the label party ended the stream with ABORTED: the run was "
                         "interrupted at step 3; resume it with --resume run")

    with pytest.raises(Stopped) as stopped:
        asyncio.run(stoppable(party(), request))
    assert stopped.value.signum == signal.SIGINT and not stopped.value.told
    assert stopped.value.then is not None and "interrupted at step 3" in stopped.value.then

    async def failed() -> None:  # no signal: a failure stays one
        raise PartyError("the label party ended the stream with INTERNAL: boom")

    with pytest.raises(PartyError):
        asyncio.run(stoppable(failed(), StopRequest()))


def test_a_stopping_party_finishes_the_checkpoint_it_is_writing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The grace after a stop cancelled the party wherever it was, a checkpoint the label party
    asked for half-written included (its sidecar's sync can take a while); it now waits for
    the checkpoint, and a second signal still stops it at once."""
    import os

    import passive_party.cli
    from passive_party.cli import Stopped, stoppable
    from passive_party.client import PartyStopped, StopRequest

    monkeypatch.setattr(passive_party.cli, "STOP_GRACE", 0.05)
    request = StopRequest()
    request.training = True
    written: list[str] = []

    async def party() -> None:
        request.checkpointing = True  # the label party's request arrived first
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.3)  # six graces long
        written.append("checkpoint")
        request.checkpointing = False
        raise PartyStopped(request.why)  # at the next message

    with pytest.raises(Stopped) as stopped:
        asyncio.run(stoppable(party(), request))
    assert written == ["checkpoint"] and stopped.value.told

    async def stuck() -> None:
        request.why, request.checkpointing = None, True
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C
        await asyncio.sleep(30)

    with pytest.raises(Stopped):
        asyncio.run(asyncio.wait_for(stoppable(stuck(), request), 10))
