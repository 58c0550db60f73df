"""Whatever a peer sends, the service answers with a status that says what is wrong, keeps
its memory bounded, and blames the right party (issue 13, items 3-5, on the wire)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from attacker.sidecar.store import GradientLog
from passive_party.client import PartyError, StepLoop
from splitleak.codec import encode_tensor
from splitleak.config import ConfigError, ExperimentConfig, parse_config
from splitleak.transport import PARTY_ID_KEY, SESSION_KEY
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc
from splitleak.validation import check_core
from tests.conftest import scaled, small_config
from tests.live import (
    RAW,
    ScriptedParty,
    gradient_record,
    join_request,
    label_party,
    record_stream,
    scripted_run,
    sidecar,
)


def one_party(tmp_path: Path, **topology) -> ExperimentConfig:
    return parse_config(small_config(
        tmp_path, features={"passive": [[0, 30]]},
        topology={"passive_parties": 1, "step_deadline_s": scaled(5), "join_deadline_s": scaled(10),
                  **topology},
        training={"batch_size": 32, "epochs": 1, "eval_interval": 0}))


def two_parties(tmp_path: Path) -> ExperimentConfig:
    return parse_config(small_config(tmp_path, topology={"join_deadline_s": scaled(10)}))


# --- item 3: bounded memory against peers ---------------------------------------------------


def test_sending_before_the_run_starts_is_refused(tmp_path: Path) -> None:
    """Party 1 streams while party 2 has not joined: nothing was asked, nothing is buffered."""
    cfg = two_parties(tmp_path)

    async def unasked(party: ScriptedParty) -> None:
        batch = pb.Batch(phase=pb.TRAIN, step=0, sample_ids=encode_tensor(np.arange(4)))
        await party.call.write(party.activation(batch))

    err, outcome = asyncio.run(scripted_run(cfg, tmp_path / "run", unasked))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    assert "passive party 1 sent a message before it was asked" in err.details()
    assert outcome["status"] == "failed" and outcome["party"] == 1


def test_sending_faster_than_asked_is_refused(tmp_path: Path) -> None:
    cfg = one_party(tmp_path)

    async def twice(party: ScriptedParty) -> None:
        message = await party.call.read()
        answer = party.activation(message.next_batch)
        await party.call.write(answer)
        await party.call.write(answer)  # only the first was asked for

    err, outcome = asyncio.run(scripted_run(cfg, tmp_path / "run", twice))
    # The copy is refused either before the label party asks for step 1 (no credit) or, on a
    # slow machine, after it (the copy then spends step 1's credit with a step-0 answer).
    if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        assert "more messages than it was asked for" in err.details()
    else:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert "sent an activation for TRAIN step 0, but TRAIN step 1 was asked" in err.details()
    assert outcome["code"] == err.code().name and outcome["culprit"] == "passive party 1"


@pytest.mark.parametrize("shape", [[17], [16, 1], [2**40], [0], []])
def test_join_must_announce_the_shape_the_config_implies(tmp_path: Path, shape: list[int]) -> None:
    cfg = one_party(tmp_path)

    async def go() -> grpc.aio.AioRpcError:
        async with label_party(cfg, tmp_path / "run") as (serving, _):
            async with grpc.aio.insecure_channel(serving.address) as channel:
                party = ScriptedParty(cfg, channel)
                request = join_request(cfg, party.bottom, embedding_shape=shape)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await party.stub.Join(request, timeout=scaled(10))
                assert list(party.bottom.embedding_shape) == [16]
                await party.join()  # the right shape is still welcome afterwards
                return err.value

    err = asyncio.run(go())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "passive party 1 announced embedding shape" in err.details()
    assert "output shape [16]" in err.details()


def test_validate_refuses_messages_that_cannot_fit(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, model={"kind": "mlp", "layers": [4096, 8],
                                                     "cut_layer": 1},
                                    training={"batch_size": 512},
                                    topology={"max_message_mb": 4}))
    with pytest.raises(ConfigError, match=r"topology.max_message_mb = 4: passive party 1's .* "
                                          r"at least \d+"):
        check_core(cfg)


def test_validate_bounds_the_tap_queue_memory(tmp_path: Path) -> None:
    """attacker.queue_size records of a full batch each: a slow sidecar could make the tapping
    party hold them all; refused naming both fields, the memory and the largest queue allowed."""
    big = small_config(tmp_path, model={"kind": "mlp", "layers": [4096, 8], "cut_layer": 1},
                       training={"batch_size": 512}, topology={"max_message_mb": 64},
                       attacker={"queue_size": 65_536})
    with pytest.raises(ConfigError, match=r"attacker.queue_size = 65536: .* training.batch_size = "
                                          r"512 .* at most 4096 MiB: lower attacker.queue_size "
                                          r"to at most \d+"):
        check_core(parse_config(big))
    check_core(parse_config(small_config(tmp_path, attacker={"queue_size": 65_536})))  # tiny


# --- item 4: the passive party keeps the real reason ----------------------------------------


class _FinishedCall:
    """A Train call the label party ended (ABORTED) while the party was computing."""

    def __init__(self) -> None:
        self.reads = [pb.LabelPartyMessage(next_batch=pb.Batch(
            phase=pb.TRAIN, step=0, sample_ids=encode_tensor(np.arange(4))))]

    async def read(self) -> pb.LabelPartyMessage:
        return self.reads.pop(0)

    async def write(self, message: pb.PartyMessage) -> None:
        raise asyncio.InvalidStateError("RPC already finished.")

    async def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.ABORTED

    async def details(self) -> str:
        return "run aborted: passive party 2 sent a NaN activation"

    def add_done_callback(self, callback: Callable[[_FinishedCall], None]) -> None:
        callback(self)  # already ended, as grpc calls it at once

    def cancel(self) -> None:
        pass


def test_a_write_after_the_label_party_ended_the_call_keeps_the_reason(tmp_path: Path) -> None:
    from passive_party.client import load_bottom

    bottom = load_bottom(one_party(tmp_path), 1)

    with pytest.raises(PartyError, match="ended the stream with ABORTED: run aborted: passive party 2"):
        asyncio.run(StepLoop(bottom, None, "r").run(_FinishedCall()))


# --- item 5: malformed and hostile messages --------------------------------------------------


def test_malformed_protobuf_is_invalid_argument_on_every_rpc(tmp_path: Path) -> None:
    cfg = one_party(tmp_path)
    garbage = b"\xff\xff\xff\x0f\x08"

    async def go() -> list[grpc.aio.AioRpcError]:
        errors = []
        async with label_party(cfg, tmp_path / "run") as (serving, _):
            async with grpc.aio.insecure_channel(serving.address) as channel:
                join = channel.unary_unary("/splitleak.v1.LabelParty/Join", **RAW)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await join(garbage, timeout=scaled(10))
                errors.append(err.value)
                party = ScriptedParty(cfg, channel)
                await party.join()
                train = channel.stream_stream("/splitleak.v1.LabelParty/Train", **RAW)
                call = train(metadata=((PARTY_ID_KEY, "1"), (SESSION_KEY, party.plan.session)))
                await call.read()
                await call.write(garbage)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.read()
                errors.append(err.value)
        async with sidecar(tmp_path / "sidecar") as (address, _):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await record_stream(address, [garbage], raw=True)
            errors.append(err.value)
        return errors

    for err in asyncio.run(go()):
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert "malformed splitleak.v1." in err.details()


def test_a_party_cannot_open_another_partys_stream_with_its_own_token(tmp_path: Path) -> None:
    """Without TLS the session token is what binds a stream to a joined party: each party
    gets its own (at 920e7e0 one token served all, so party 2 could speak for party 1)."""
    cfg = two_parties(tmp_path)

    async def go() -> grpc.aio.AioRpcError:
        async with label_party(cfg, tmp_path / "run") as (serving, _):
            async with grpc.aio.insecure_channel(serving.address) as channel:
                first, second = ScriptedParty(cfg, channel, 1), ScriptedParty(cfg, channel, 2)
                await first.join()
                await second.join()
                assert first.plan.session != second.plan.session
                call = pb_grpc.LabelPartyStub(channel).Train(
                    metadata=((PARTY_ID_KEY, "1"), (SESSION_KEY, second.plan.session)))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.read()
                return err.value

    err = asyncio.run(go())
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err.details()
    assert "passive party 1 opened a Train stream without joining" in err.details()


def test_absurd_party_id_metadata_is_unauthenticated_and_not_echoed(tmp_path: Path) -> None:
    cfg = one_party(tmp_path)

    async def go(value: str) -> grpc.aio.AioRpcError:
        async with label_party(cfg, tmp_path / f"run-{len(value)}") as (serving, _):
            async with grpc.aio.insecure_channel(serving.address) as channel:
                call = pb_grpc.LabelPartyStub(channel).Train(metadata=((PARTY_ID_KEY, value),))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.read()
                return err.value

    for value in ("9" * 5000, "-1", "1 ", "x" * 100):
        err = asyncio.run(go(value))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (value[:10], err.details())
        assert len(err.details()) < 300


def test_long_peer_values_are_cut_in_error_details(tmp_path: Path) -> None:
    cfg = one_party(tmp_path)

    async def go() -> tuple[grpc.aio.AioRpcError, grpc.aio.AioRpcError]:
        async with label_party(cfg, tmp_path / "run") as (serving, _):
            async with grpc.aio.insecure_channel(serving.address) as channel:
                party = ScriptedParty(cfg, channel)
                with pytest.raises(grpc.aio.AioRpcError) as join_err:
                    await party.stub.Join(join_request(cfg, party.bottom, config_hash="h" * 100_000),
                                          timeout=scaled(10))
        async with sidecar(tmp_path / "sidecar") as (address, _):
            with pytest.raises(grpc.aio.AioRpcError) as record_err:
                await record_stream(address, [gradient_record(run_id="r" * 100_000)])
        return join_err.value, record_err.value

    for err in asyncio.run(go()):
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert len(err.details()) < 400 and "100000 characters" in err.details()


def test_message_over_the_limit_is_resource_exhausted_naming_it(tmp_path: Path) -> None:
    cfg = one_party(tmp_path, max_message_mb=1)

    async def huge(party: ScriptedParty) -> None:
        await party.call.read()
        activation = encode_tensor(np.zeros((32, 9000), np.float32))  # 1.1 MiB
        await party.call.write(pb.PartyMessage(phase=pb.TRAIN, step=0, activation=activation))

    err, _ = asyncio.run(scripted_run(cfg, tmp_path / "run", huge))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "topology.max_message_mb = 1" in err.details()


def test_message_over_twice_the_limit_still_names_the_limit(tmp_path: Path) -> None:
    """gRPC cuts such a stream off before any code of ours sees the message (bounding what a
    peer makes the label party hold); the outcome names the limit, not only a closed stream."""
    cfg = one_party(tmp_path, max_message_mb=1)

    async def huge(party: ScriptedParty) -> None:
        await party.call.read()
        activation = encode_tensor(np.zeros((32, 20_000), np.float32))  # 2.4 MiB
        await party.call.write(pb.PartyMessage(phase=pb.TRAIN, step=0, activation=activation))

    _, outcome = asyncio.run(scripted_run(cfg, tmp_path / "run", huge))
    assert outcome["status"] == "failed" and outcome["party"] == 1, outcome
    assert "over 2 MiB, twice topology.max_message_mb = 1" in outcome["message"], outcome


def test_a_party_that_ends_its_stream_is_said_to_have_exited_first(tmp_path: Path) -> None:
    """What every passive party's death looks like: the end named the size cut-off alone."""
    cfg = one_party(tmp_path, max_message_mb=1)

    async def leave(party: ScriptedParty) -> None:
        await party.call.read()
        await party.call.done_writing()

    _, outcome = asyncio.run(scripted_run(cfg, tmp_path / "run", leave))
    message = outcome["message"]
    assert outcome["status"] == "failed" and outcome["party"] == 1, outcome
    assert "ended its stream, most likely because it exited or lost its connection" in message
    assert message.index("exited") < message.index("over 2 MiB"), message


def test_a_write_cut_off_by_the_label_party_reports_its_status(tmp_path: Path) -> None:
    """The label party ends a party's stream (the run aborted) while the party writes: gRPC
    replaced the label party's status with 'INTERNAL: Internal error from Core'."""
    from passive_party.client import EndStatus, _write

    class Aborting(pb_grpc.LabelPartyServicer):
        async def Train(self, requests, context):  # noqa: N802 (gRPC method name)
            await requests.__anext__()
            await context.abort(grpc.StatusCode.ABORTED, "run aborted: party 1 failed")
            yield pb.LabelPartyMessage()  # unreachable: makes this a streaming handler

    async def go() -> set[str]:
        server = grpc.aio.server()
        pb_grpc.add_LabelPartyServicer_to_server(Aborting(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        activation = encode_tensor(np.zeros((64, 256), np.float32))
        message = pb.PartyMessage(phase=pb.TRAIN, step=0, activation=activation)
        said = set()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                for _ in range(20):  # the write is in flight when the status comes, most times
                    call = pb_grpc.LabelPartyStub(channel).Train()
                    ended = EndStatus(call)
                    with pytest.raises(PartyError) as err:
                        for _ in range(1000):
                            await _write(call, message, ended)
                    said.add(str(err.value))
                    call.cancel()
        finally:
            await server.stop(0)
        return said

    assert asyncio.run(go()) == {
        "the label party ended the stream with ABORTED: run aborted: party 1 failed"}


def test_an_impostor_label_party_is_named_at_once(tmp_path: Path) -> None:
    """A server at the label party's address presenting another role's certificate: the
    passive party says so within seconds (it waited for its join deadline, then said
    DEADLINE_EXCEEDED)."""
    import time

    from passive_party.client import run_party
    from splitleak import tls
    from splitleak.artifacts.paths import RunDir
    from splitleak.config import TopologyConfig
    from splitleak.transport import bind, create_server

    certs = tmp_path / "certs"
    tls.generate(certs, tls.identities(1))
    cfg = parse_config(small_config(tmp_path, features={"passive": [[0, 30]]},
                                    topology={"passive_parties": 1, "tls": True,
                                              "join_deadline_s": 60}))

    async def go() -> tuple[float, str]:
        server = create_server(TopologyConfig())
        port = bind(server, "127.0.0.1:0", certs, tls.ATTACKER)  # the sidecar's identity
        await server.start()
        started = time.monotonic()
        try:
            with pytest.raises(PartyError) as err:
                await run_party(cfg, 1, f"127.0.0.1:{port}", RunDir(tmp_path / "run"), tls_dir=certs)
            return time.monotonic() - started, str(err.value)
        finally:
            await server.stop(0)

    seconds, message = asyncio.run(go())
    assert seconds < scaled(15), (seconds, message)
    assert (f"is not this run's label party: its TLS certificate, signed by {certs / 'ca.pem'}, "
            "is another role's") in message, message
    assert "Hostname Verification Check failed" in message and "--label-party" in message, message


def test_overflowing_activation_fails_the_step_naming_the_party(tmp_path: Path) -> None:
    """Finite, but so large the loss is not: the sender is named, not the label party."""
    cfg = two_parties(tmp_path)

    async def go() -> dict:
        async with label_party(cfg, tmp_path / "run") as (serving, outcome):
            async with grpc.aio.insecure_channel(serving.address) as channel:
                parties = [ScriptedParty(cfg, channel, k) for k in (1, 2)]
                for party in parties:
                    await party.join()
                    await party.open()
                for party in parties:
                    message = await party.call.read()
                    answer = party.activation(message.next_batch)
                    if party.bottom.party_id == 2:
                        shape = tuple(answer.activation.shape)
                        answer.activation.CopyFrom(encode_tensor(torch.full(shape, 3e38)))
                    await party.call.write(answer)
                return await asyncio.wait_for(outcome, scaled(30))

    outcome = asyncio.run(go())
    assert outcome["status"] == "failed" and outcome["code"] == "INVALID_ARGUMENT"
    assert outcome["party"] == 2 and "passive party 2's activation overflows it" in outcome["message"]


# --- the sidecar's log: ranges, widths, schemas, disk ------------------------------------------


@pytest.mark.parametrize(("record", "needle"), [
    (gradient_record(epoch=2**31), "out of the logged range"),
    (gradient_record(step=2**63), "out of the logged range"),
    (gradient_record(width=0), "width 0"),
])
def test_records_outside_what_the_log_holds_are_invalid_argument(tmp_path: Path, record,
                                                                 needle: str) -> None:
    async def go() -> grpc.aio.AioRpcError:
        async with sidecar(tmp_path) as (address, _):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await record_stream(address, [record])
            return err.value

    err = asyncio.run(go())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in err.details()


def test_a_refused_first_record_does_not_fix_the_schema(tmp_path: Path) -> None:
    async def go() -> None:
        async with sidecar(tmp_path) as (address, _):
            with pytest.raises(grpc.aio.AioRpcError):
                await record_stream(address, [gradient_record(width=5, epoch=2**31)])
            summary = await record_stream(address, [gradient_record(width=3, step=s)
                                                    for s in range(3)])
            assert summary.records == 3

    asyncio.run(go())
    assert GradientLog(tmp_path / "attacker" / "gradients").shapes(1) == {"cut_gradient": [3]}
