"""The step loops take start-up's objects out of the garbage collector's generations: a full
collection during training then scans what training made, not the imports (a 0.6-1.0 s pause
of one step on 2 cores)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from orchestration.reference import run_reference
from splitleak import heap
from splitleak.artifacts.rundir import create_run_dir
from splitleak.codec import encode_tensor
from splitleak.config import parse_config
from splitleak.heap import freeze_start_up
from splitleak.v1 import split_learning_pb2 as pb
from tests.conftest import small_config


@pytest.fixture
def unfrozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with nothing frozen and leaves the test process as it found it."""
    gc.unfreeze()
    monkeypatch.setattr(heap, "_frozen", False)
    yield
    gc.unfreeze()


def test_freezing_moves_what_is_alive_out_of_the_collections(unfrozen: None) -> None:
    alive = [[] for _ in range(1000)]  # lists: objects the collector tracks
    freeze_start_up()
    assert gc.get_freeze_count() >= len(alive)
    assert gc.get_count()[0] < len(alive)  # the youngest generation holds none of them


def test_a_process_freezes_once_not_every_runs_leftovers(unfrozen: None) -> None:
    freeze_start_up()
    frozen = gc.get_freeze_count()
    later = [[] for _ in range(1000)]  # e.g. a finished sweep point's objects
    freeze_start_up()
    assert len(later) and gc.get_freeze_count() == frozen


class _Call:
    """A label party that asks for one train batch, then says done."""

    def __init__(self, messages: list[pb.LabelPartyMessage]) -> None:
        self.messages = messages

    async def read(self) -> pb.LabelPartyMessage:
        return self.messages.pop(0)

    async def write(self, message: pb.PartyMessage) -> None:
        pass

    async def done_writing(self) -> None:
        pass

    async def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.OK

    def cancel(self) -> None:
        pass

    def add_done_callback(self, callback: object) -> None:
        pass


def test_the_passive_partys_step_loop_freezes_its_start_up(tmp_path: Path, unfrozen: None) -> None:
    from passive_party.client import StepLoop, load_bottom

    cfg = parse_config(small_config(tmp_path, features={"passive": [[0, 30]]},
                                    topology={"passive_parties": 1}))
    bottom = load_bottom(cfg, 1)
    batch = pb.Batch(phase=pb.TRAIN, step=0, sample_ids=encode_tensor(np.arange(4)))
    call = _Call([pb.LabelPartyMessage(next_batch=batch), pb.LabelPartyMessage(done=True)])
    assert gc.get_freeze_count() == 0
    asyncio.run(StepLoop(bottom, None, "r").run(call))
    assert gc.get_freeze_count() > 0


def test_the_label_partys_step_loop_freezes_its_start_up(tmp_path: Path, unfrozen: None) -> None:
    cfg = parse_config(small_config(tmp_path, training={"max_steps": 2, "eval_interval": 0}))
    run = create_run_dir(cfg, tmp_path / "runs", "-heap")
    assert gc.get_freeze_count() == 0
    run_reference(cfg, run)  # the in-process reference runs the label party's loop (drive)
    assert gc.get_freeze_count() > 0
