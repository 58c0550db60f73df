"""Bad input on the wire: each ends in a gRPC status a person can act on, never a hang."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import torch

from passive_party.client import load_bottom
from splitleak.artifacts.paths import RunDir
from splitleak.codec import decode_ids, encode_tensor
from splitleak.config import PROTOCOL_VERSION, ExperimentConfig, load_config
from splitleak.transport import PARTY_ID_KEY, SESSION_KEY
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc
from tests.conftest import small_config, write_config

pytestmark = pytest.mark.slow


class LabelPartyProcess:
    """A real `label-party serve` process on a free loopback port."""

    def __init__(self, tmp_path: Path, parties: int = 1, **topology: float) -> None:
        ranges = [[0, 30]] if parties == 1 else [[0, 15], [15, 30]]
        data = small_config(tmp_path, features={"passive": ranges},
                            topology={"passive_parties": parties, "step_deadline_s": 3,
                                      "join_deadline_s": 10, **topology},
                            training={"batch_size": 32, "epochs": 3, "eval_interval": 0})
        self.config_path = write_config(tmp_path, data)
        self.run = RunDir(tmp_path / "run")
        port_file = tmp_path / "address"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "label_party", "serve", "--config", str(self.config_path),
             "--run-dir", str(self.run.root), "--port-file", str(port_file),
             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        end = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().endswith("\n")):
            assert self.process.poll() is None, self.process.communicate()[0]
            assert time.monotonic() < end, "label party did not start"
            time.sleep(0.05)
        self.address = port_file.read_text().strip()
        self.cfg: ExperimentConfig = load_config(self.config_path)

    def wait(self, timeout: float = 30) -> tuple[int, dict]:
        out, _ = self.process.communicate(timeout=timeout)
        return self.process.returncode, json.loads(self.run.outcome.read_text())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def label_party(tmp_path: Path):
    processes: list[LabelPartyProcess] = []

    def start(parties: int = 1, **topology: float) -> LabelPartyProcess:
        processes.append(LabelPartyProcess(tmp_path, parties, **topology))
        return processes[-1]

    yield start
    for p in processes:
        p.close()


def _join_request(lp: LabelPartyProcess, party_id: int = 1, **changes) -> pb.JoinRequest:
    bottom = load_bottom(lp.cfg, 1)
    fields = dict(protocol_version=PROTOCOL_VERSION, party_id=party_id,
                  embedding_shape=bottom.embedding_shape, config_hash=lp.cfg.hash,
                  num_rows=bottom.inputs.num_rows)
    fields.update(changes)
    return pb.JoinRequest(**fields)


async def _join(lp: LabelPartyProcess, request: pb.JoinRequest) -> pb.TrainingPlan:
    async with grpc.aio.insecure_channel(lp.address) as channel:
        return await pb_grpc.LabelPartyStub(channel).Join(request, timeout=10)


def _join_error(lp: LabelPartyProcess, request: pb.JoinRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(_join(lp, request))
    return err.value


def test_join_refusals_name_the_problem(label_party) -> None:
    lp = label_party(parties=1)
    err = _join_error(lp, _join_request(lp, protocol_version=99))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "protocol version 99" in err.details() and f"version {PROTOCOL_VERSION}" in err.details()
    err = _join_error(lp, _join_request(lp, party_id=7))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "unknown party id 7" in err.details() and "1..1" in err.details()
    assert "give --party-id in that range" in err.details()
    err = _join_error(lp, _join_request(lp, config_hash="0" * 16))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "same experiment file" in err.details()
    other = lp.cfg.model_copy(update={"training": lp.cfg.training.model_copy(update={"epochs": 7})})
    err = _join_error(lp, _join_request(lp, config_hash=other.hash,
                                        config_sections=other.section_hashes()))
    assert ", in [training]: every party must use the same experiment file" in err.details()
    err = _join_error(lp, _join_request(lp, config_hash=other.hash,
                                        config_sections=other.section_hashes(),
                                        config_fields=other.field_hashes()))
    assert ", in training.epochs: every party must use the same experiment file" in err.details()
    err = _join_error(lp, _join_request(lp, config_fields={str(i): "0" for i in range(5000)}))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "JoinRequest.config_fields has 5000 entries; at most 4096" in err.details()
    err = _join_error(lp, _join_request(lp, num_rows=5))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "do not align" in err.details()
    assert "every host needs the same data file" in err.details()
    assert asyncio.run(_join(lp, _join_request(lp))).total_train_steps > 0
    err = _join_error(lp, _join_request(lp))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and "already joined" in err.details()
    # Two hosts started with the same --party-id: the second is told what to change.
    assert "give each passive party its own --party-id in 1..1" in err.details()
    # Joined but never streamed: the label party gives up at its join deadline, naming it.
    code, outcome = lp.wait()
    assert code == 1 and outcome["code"] == "DEADLINE_EXCEEDED"
    assert "passive party 1 joined but did not open its Train stream" in outcome["message"]


async def _fake_party(lp: LabelPartyProcess, tamper, answer_steps: int = 10**9) -> grpc.aio.AioRpcError:
    """A passive party that answers honestly except where `tamper` changes the activation."""
    bottom = load_bottom(lp.cfg, 1)
    async with grpc.aio.insecure_channel(lp.address) as channel:
        stub = pb_grpc.LabelPartyStub(channel)
        plan = await stub.Join(_join_request(lp), timeout=10)
        call = stub.Train(metadata=((PARTY_ID_KEY, "1"), (SESSION_KEY, plan.session)))
        answered = 0
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    break
                if message.HasField("cut_gradient"):
                    bottom.backward(torch.zeros(bottom.pending_shape))
                if message.HasField("checkpoint"):
                    continue  # a fake party keeps no checkpoints: the label party gives up on it
                batch = message.next_batch
                if answered >= answer_steps:
                    continue  # stall: keep the connection open, send nothing
                ids = decode_ids(batch.sample_ids, field="ids")
                activation = bottom.forward(ids, batch.phase == pb.TRAIN)
                step = batch.step
                if answered == 2:
                    activation, step = tamper(activation, step)
                await call.write(pb.PartyMessage(phase=batch.phase, step=step,
                                                 activation=encode_tensor(activation)))
                answered += 1
        except grpc.aio.AioRpcError as err:
            return err
    raise AssertionError("the label party accepted the bad activation")


@pytest.mark.parametrize(("tamper", "needle"), [
    (lambda a, s: (a[:, :-1], s), "shape"),
    (lambda a, s: (a.double(), s), "float64"),
    (lambda a, s: (a[:-1], s), "shape"),
    (lambda a, s: (a.masked_fill(torch.ones_like(a, dtype=torch.bool).tril(), float("nan")), s),
     "NaN"),
    (lambda a, s: (a, s + 5), "step"),
])
def test_bad_activation_is_invalid_argument(label_party, tamper, needle) -> None:
    lp = label_party(parties=1)
    err = asyncio.run(_fake_party(lp, tamper))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "passive party 1" in err.details() and needle in err.details()
    code, outcome = lp.wait()
    assert code == 1 and outcome["code"] == "INVALID_ARGUMENT" and outcome["party"] == 1


def test_stalled_party_hits_the_step_deadline(label_party) -> None:
    lp = label_party(parties=1)
    started = time.monotonic()

    async def stall() -> grpc.aio.AioRpcError:
        return await asyncio.wait_for(_fake_party(lp, lambda a, s: (a, s), answer_steps=3), 30)

    err = asyncio.run(stall())
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "passive party 1 sent no activation" in err.details()
    code, outcome = lp.wait()
    assert code == 1 and outcome["code"] == "DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 20


def test_stream_without_joining_is_refused(label_party) -> None:
    lp = label_party(parties=1)

    async def go() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(lp.address) as channel:
            call = pb_grpc.LabelPartyStub(channel).Train(metadata=((PARTY_ID_KEY, "1"),
                                                                   (SESSION_KEY, "forged")))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            return err.value

    err = asyncio.run(go())
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "without joining" in err.details()


def test_dead_party_is_named_and_the_other_party_exits_nonzero(label_party, tmp_path) -> None:
    lp = label_party(parties=2, step_deadline_s=10, join_deadline_s=90)
    parties = [subprocess.Popen(
        [sys.executable, "-m", "passive_party", "run", "--config", str(lp.config_path),
         "--party-id", str(k), "--label-party", lp.address, "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in (1, 2)]
    try:
        metrics = lp.run.metrics
        end = time.monotonic() + 60
        while not (metrics.exists() and '"step":2' in metrics.read_text()):
            assert time.monotonic() < end
            time.sleep(0.02)
        parties[1].kill()
        code, outcome = lp.wait()
        assert code == 1 and outcome["party"] == 2 and outcome["code"] == "UNAVAILABLE"
        assert "passive party 2" in outcome["message"]
        out, _ = parties[0].communicate(timeout=30)
        assert parties[0].returncode == 1 and "passive party 2" in out
    finally:
        for p in parties:
            if p.poll() is None:
                p.kill()


def test_a_label_party_lost_in_training_is_named_with_what_to_do() -> None:
    """One party per host, the label party killed: each party said 'label party refused or
    failed while training: UNAVAILABLE: Stream removed (Socket closed)', as if it had been
    refused; a status the label party sent itself keeps its own words."""
    from passive_party.client import _describe

    def error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)

    lost = _describe(error(grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)"),
                     "training")
    assert lost.startswith("lost the label party while training (UNAVAILABLE: Stream removed"), lost
    assert "continue the run with --resume on every host" in lost and "refused" not in lost, lost
    sent = _describe(error(grpc.StatusCode.UNAVAILABLE, "passive party 1 dropped its connection"),
                     "training")
    assert sent == ("label party refused or failed while training: UNAVAILABLE: passive party 1 "
                    "dropped its connection"), sent
