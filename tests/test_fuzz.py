"""Bounded fuzzing of Join, Train and Record against live services on loopback (issue 13,
item 7): random bytes, mutated valid messages and hostile field values; never UNKNOWN or
INTERNAL, never a hang (every call has a deadline the service must beat), no crash, bounded
memory. `splitleak soak` runs the long version with the same senders."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestration.soak import (
    FORBIDDEN,
    SessionRig,
    fuzz_config,
    rss_mb,
    send_join,
    send_record,
    send_unadmitted,
)
from passive_party.client import load_bottom
from splitleak.codec import encode_ids, encode_tensor
from splitleak.config import PROTOCOL_VERSION
from splitleak.transport import PARTY_ID_KEY, SESSION_KEY
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import tensor_pb2
from tests.conftest import scaled
from tests.live import label_party, sidecar

FUZZ = settings(max_examples=600, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
TIMEOUT = scaled(5)
RSS_GROWTH_MB = 300  # what the whole module may add to this process's resident memory


class Services:
    """A label party and a sidecar, each a real gRPC server, in one event loop of their own."""

    def __init__(self, root: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.root = root
        self.cfg = fuzz_config(root)
        self.bottom = load_bottom(self.cfg, 1)
        self.codes: Counter = Counter()
        self._contexts: list = []

    def run(self, coroutine):  # noqa: ANN001, ANN201 - any coroutine, its result
        return self.loop.run_until_complete(coroutine)

    def __enter__(self) -> Services:
        self.label_party = label_party(self.cfg, self.root / "run")
        # Party 9 is observed but never streams: the sidecar's run never ends while fuzzed.
        # Party 1's records have the shapes a config would give it (VALID_RECORD's): no fuzzed
        # first record can fix another.
        self.sidecar = sidecar(self.root / "sidecar", frozenset({1, 9}), run_id="r1", limit_mb=1,
                               shapes={(apb.PASSIVE_PARTY, 1): {"cut_gradient": (3,)}})
        self._contexts = [self.label_party, self.sidecar]
        (serving, _), (self.sidecar_address, _) = (self.run(c.__aenter__()) for c in self._contexts)
        self.label_address = serving.address
        self.rig = SessionRig(self.cfg, self.root / "sessions")
        self.run(self.rig.start())

        async def channels() -> tuple:
            return (grpc.aio.insecure_channel(self.label_address),
                    grpc.aio.insecure_channel(self.sidecar_address),
                    grpc.aio.insecure_channel(self.rig.address))

        self.label_channel, self.sidecar_channel, self.rig_channel = self.run(channels())
        return self

    def __exit__(self, *exc: object) -> None:
        for channel in (self.label_channel, self.sidecar_channel, self.rig_channel):
            self.run(channel.close())
        self.run(self.rig.stop())
        for context in reversed(self._contexts):
            self.run(context.__aexit__(None, None, None))
        self.loop.close()

    def check(self, code: str) -> None:
        self.codes[code] += 1
        assert code not in FORBIDDEN, f"the service answered {code}"


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    before = rss_mb(os.getpid())
    with Services(tmp_path_factory.mktemp("fuzz")) as live:
        yield live
        # Still serving after everything: a valid request gets its ordinary answer.
        record = apb.GradientRecord(run_id="r1", party_id=1, epoch=0, step=2**62,
                                    sample_ids=encode_ids(np.arange(2, dtype=np.int64)),
                                    cut_gradient=encode_tensor(np.ones((2, 3), np.float32)))
        live.check(live.run(send_record(live.sidecar_channel, [record.SerializeToString()],
                                        TIMEOUT)))
    after = rss_mb(os.getpid())
    assert after - before < RSS_GROWTH_MB, f"RSS grew {after - before:.0f} MiB while fuzzing"


# --- strategies ----------------------------------------------------------------------------

u32, u64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
sizes = st.one_of(st.integers(-3, 40), st.sampled_from([2**31, 2**40, 2**62, 2**63 - 1]))
tensors = st.builds(tensor_pb2.Tensor, dtype=st.integers(0, 12),
                    shape=st.lists(sizes, max_size=4), data=st.binary(max_size=2048))
header_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200)


def mutations(valid: bytes) -> st.SearchStrategy[bytes]:
    """`valid` with bytes replaced, cut short, or garbage inserted."""
    def apply(edit: tuple[list[tuple[int, int]], int, bytes]) -> bytes:
        flips, cut, insert = edit
        data = bytearray(valid)
        for index, value in flips:
            data[index % len(data)] = value
        data = data[: cut % (len(data) + 1)] if cut else data
        return bytes(data) + insert

    return st.tuples(st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=8),
                     st.integers(0, 2**16), st.binary(max_size=32)).map(apply)


def hostile(valid: bytes, fields: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=512), mutations(valid),
                     fields.map(lambda message: message.SerializeToString()))


def _valid_join(services: Services) -> pb.JoinRequest:
    bottom = services.bottom
    return pb.JoinRequest(protocol_version=PROTOCOL_VERSION, party_id=1,
                          embedding_shape=bottom.embedding_shape, config_hash="not-this-run",
                          num_rows=bottom.inputs.num_rows)


join_fields = st.builds(pb.JoinRequest, protocol_version=st.one_of(st.just(PROTOCOL_VERSION), u32),
                        party_id=st.one_of(st.just(1), u32), embedding_shape=st.lists(i64, max_size=6),
                        config_hash=st.text(max_size=300), num_rows=u64)
VALID_RECORD = apb.GradientRecord(run_id="r1", party_id=1, epoch=0, step=0,
                                  sample_ids=encode_ids(np.arange(4, dtype=np.int64)),
                                  cut_gradient=encode_tensor(np.ones((4, 3), np.float32)))
record_fields = st.builds(apb.GradientRecord, run_id=st.one_of(st.just("r1"), st.text(max_size=200)),
                          party_id=st.one_of(st.just(1), u32), epoch=u32, step=u64,
                          sample_ids=st.one_of(st.just(VALID_RECORD.sample_ids), tensors),
                          cut_gradient=st.one_of(st.just(VALID_RECORD.cut_gradient), tensors),
                          first_layer_gradient=st.one_of(st.none(), tensors),
                          stopped=st.one_of(st.none(), st.builds(
                              apb.TapStop, reason=st.text(max_size=5000), resumable=st.booleans())))
VALID_ANSWER = pb.PartyMessage(phase=pb.TRAIN, step=0,
                               activation=encode_tensor(np.ones((32, 16), np.float32)))
party_fields = st.one_of(
    st.builds(pb.PartyMessage, phase=st.integers(0, 9), step=u64,
              activation=st.one_of(st.just(VALID_ANSWER.activation), tensors)),
    st.builds(lambda step, sha: pb.PartyMessage(checkpoint=pb.CheckpointAck(step=step, sha256=sha)),
              u64, st.text(max_size=100)),
    st.builds(lambda what, why: pb.PartyMessage(failure=pb.PartyFailure(component=what, message=why)),
              st.text(max_size=100), st.text(max_size=5000)))


# --- the fuzzers ---------------------------------------------------------------------------


@FUZZ
@given(payload=st.data())
def test_join_never_fails_the_service(services: Services, payload: st.DataObject) -> None:
    data = payload.draw(hostile(_valid_join(services).SerializeToString(), join_fields))
    services.check(services.run(send_join(services.label_channel, data, TIMEOUT)))


@FUZZ
@given(messages=st.lists(hostile(VALID_RECORD.SerializeToString(), record_fields),
                         min_size=1, max_size=3))
def test_record_never_fails_the_service(services: Services, messages: list[bytes]) -> None:
    services.check(services.run(send_record(services.sidecar_channel, messages, TIMEOUT)))


@FUZZ
@given(party=header_text, session=header_text,
       messages=st.lists(hostile(VALID_ANSWER.SerializeToString(), party_fields), max_size=3))
def test_train_without_admission_never_fails_the_service(services: Services, party: str,
                                                          session: str, messages: list[bytes]) -> None:
    metadata = ((PARTY_ID_KEY, party.strip() or "x"), (SESSION_KEY, session.strip() or "x"))
    services.check(services.run(send_unadmitted(services.label_channel, metadata, messages,
                                                TIMEOUT)))


@settings(FUZZ, max_examples=150)
@given(messages=st.lists(st.one_of(hostile(VALID_ANSWER.SerializeToString(), party_fields),
                                   st.just(b"valid")), min_size=1, max_size=3))
def test_admitted_train_never_fails_the_service(services: Services, messages: list[bytes]) -> None:
    """Inside a run that has started: the answer to its first batch (an honest one where the
    case says "valid") and what follows; a fresh run per case."""
    def answers(valid: pb.PartyMessage) -> list[bytes]:
        return [valid.SerializeToString() if m == b"valid" else m for m in messages]

    services.check(services.run(services.rig.case(services.rig_channel, answers, TIMEOUT)))


@pytest.mark.parametrize("times", [1.5, 2.5, 6.0])
def test_oversized_messages_are_resource_exhausted_naming_a_limit(services: Services,
                                                                   times: float) -> None:
    """Between the limit and twice it, splitleak refuses naming topology.max_message_mb;
    above, gRPC does, naming its own cap (twice the limit, in bytes); never a closed stream."""
    rows = int(times * (1 << 20) / 12)
    record = apb.GradientRecord(run_id="r1", party_id=1, epoch=0, step=0,
                                sample_ids=encode_ids(np.arange(rows, dtype=np.int64)),
                                cut_gradient=encode_tensor(np.ones((rows, 1), np.float32)))
    join = pb.JoinRequest(protocol_version=PROTOCOL_VERSION, party_id=1,
                          config_hash="x" * int(times * (1 << 20)))

    async def both() -> list[grpc.aio.AioRpcError]:
        errors = []
        for call, payload in [(services.sidecar_channel.stream_unary(
                "/splitleak.v1.AttackerSidecar/Record"), iter([record.SerializeToString()])),
                (services.label_channel.unary_unary("/splitleak.v1.LabelParty/Join"),
                 join.SerializeToString())]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(payload, timeout=TIMEOUT)
            errors.append(err.value)
        return errors

    for err in services.run(both()):
        services.check(err.code().name)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
        named = ("topology.max_message_mb = 1 MiB" if times < 2 else
                 "Received message larger than max") in err.details()
        assert named, err.details()


def test_the_fuzzers_reached_the_services(services: Services) -> None:
    """Runs after the fuzzers: they met refusals of every kind, not only one wall."""
    seen = set(services.codes)
    assert {"INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED",
            "FAILED_PRECONDITION"} <= seen, services.codes
    assert sum(services.codes.values()) >= 1500
