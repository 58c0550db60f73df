"""The label party's tap ([threat.receiver]): every activation it receives from a victim reaches
the sidecar as received, in a log of its own, survives a resume, and only the label party may
write there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import pytest

from attacker.sidecar.store import GradientLog
from splitleak import tls
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import write_config
from splitleak.codec import encode_ids, encode_tensor
from splitleak.config import TopologyConfig, parse_config
from splitleak.transport import create_channel
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import attacker_pb2_grpc as apb_grpc
from tests.conftest import scaled, small_config
from tests.live import whole_run
from tests.runs import assert_same_run, logged
from tests.test_sidecar import _record, _send, _start_sidecar


def _received(party: int, step: int, rows: int = 4, **fields: object) -> apb.GradientRecord:
    """What the label party received from `party` at `step` (every value = step)."""
    return apb.GradientRecord(run_id="r1", party_id=party, epoch=0, step=step,
                              sample_ids=encode_ids(np.arange(rows, dtype=np.int64)),
                              activation=encode_tensor(np.full((rows, 3), step, np.float32)),
                              observer=apb.LABEL_PARTY, **fields)


def test_the_sidecar_keeps_the_label_partys_records_apart(tmp_path: Path) -> None:
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--receive", "1", "--run-id", "r1")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:  # not a victim
            asyncio.run(_send(address, [_received(2, 0)]))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "the label party of what it receives from party 2 are not accepted" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the label party receives no gradient
            asyncio.run(_send(address, [_received(1, 0, cut_gradient=encode_tensor(np.ones((4, 3))))]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "records only the activation it received" in err.value.details()
        label = asyncio.run(_send(address, [_received(1, s) for s in range(4)]))
        passive = asyncio.run(_send(address, [_record(1, s) for s in range(3)]))
        assert (label.records, passive.records) == (4, 3)
        assert proc.wait(timeout=scaled(30)) == 0  # both streams done: the sidecar ends
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    received = list(GradientLog(tmp_path / "run" / "attacker" / "received").batches(1))
    assert [b.step for b in received] == [0, 1, 2, 3]
    assert all(set(b.tensors) == {"activation"} and (b.tensors["activation"] == b.step).all()
               for b in received)
    gradients = list(GradientLog(tmp_path / "run" / "attacker" / "gradients").batches(1))
    assert [b.step for b in gradients] == [0, 1, 2] and "activation" not in gradients[0].tensors


def test_only_the_label_partys_certificate_may_send_what_it_received(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    tls.generate(certs, tls.identities(1))
    proc, address = _start_sidecar(tmp_path, "--party", "1", "--receive", "1", "--run-id", "r1",
                                   "--tls-dir", str(certs))

    async def send(identity: str) -> apb.RecordSummary:
        async with create_channel(address, TopologyConfig(), certs, identity,
                                  server_identity=tls.ATTACKER) as channel:
            stub = apb_grpc.AttackerSidecarStub(channel)
            return await stub.Record(iter([_received(1, 0)]), timeout=scaled(20))

    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            asyncio.run(send(tls.passive_identity(1)))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "may not send the records of the label party (receiving from party 1)" in err.value.details()
        assert asyncio.run(send(tls.LABEL_PARTY)).records == 1
    finally:
        proc.kill()
        proc.wait()


def _victim_config(tmp_path: Path, **overrides: object):
    """breast_cancer in batches of 16 (27 train steps, a checkpoint every 5); party 1's tap
    records what it sent, the label party's what it received from party 1."""
    data = small_config(
        tmp_path, training={"batch_size": 16, "epochs": 1, "eval_interval": 7, "checkpoint_every": 5},
        topology={"step_deadline_s": scaled(20), "join_deadline_s": scaled(30)},
        attacker={"record_activation": True},
        threat={"parties": {"1": {"curious": True}}, "receiver": {"victims": [1]}}, **overrides)
    return parse_config(data)


def _fresh(cfg, root: Path) -> RunDir:
    run = RunDir(root)
    root.mkdir(parents=True)
    write_config(cfg, run)
    return run


def test_what_the_label_party_received_is_what_the_party_sent(tmp_path: Path) -> None:
    """Over real gRPC: the label party's log of party 1 equals, step for step, the activations
    party 1's own tap says it sent; nothing is logged of party 2 on the receiving side."""
    cfg = _victim_config(tmp_path)
    run = _fresh(cfg, tmp_path / "run")
    outcome, errors = asyncio.run(whole_run(cfg, run.root))
    assert outcome["status"] == "ok" and errors == [None, None]
    assert outcome["received_tap"]["1"]["acknowledged"] == 27
    sent, received = logged(run)[1], logged(run, "received")
    assert list(received) == [1] and len(received[1]) == len(sent) == 27
    for (e, s, ids, tensors), (re, rs, rids, rtensors) in zip(sent, received[1], strict=True):
        assert (e, s) == (re, rs) and np.array_equal(ids, rids)
        assert np.array_equal(tensors["activation"], rtensors["activation"])


def test_an_interrupted_run_resumes_to_the_same_received_log(tmp_path: Path) -> None:
    cfg = _victim_config(tmp_path)
    straight = _fresh(cfg, tmp_path / "straight")
    outcome, _ = asyncio.run(whole_run(cfg, straight.root))
    assert outcome["status"] == "ok"
    run = _fresh(cfg, tmp_path / "interrupted")
    outcome, _ = asyncio.run(whole_run(cfg, run.root, interrupt_at=12))
    assert outcome["status"] == "interrupted" and 12 <= outcome["step"] < 27
    outcome, errors = asyncio.run(whole_run(cfg, run.root, resume=True))
    assert outcome["status"] == "ok" and errors == [None, None]
    assert_same_run(straight, run, parties=2)  # the received log too, record for record
