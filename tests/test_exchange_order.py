"""The label party hands the slowest party's message to gRPC first, and runs its own pending
update once the messages are on their way, before the answers are read."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import torch

from label_party.exchange import NetworkExchange
from label_party.schedule import Batch, Phase
from label_party.session import PartyStream
from splitleak.codec import encode_tensor
from splitleak.config import load_config
from splitleak.v1 import split_learning_pb2 as pb


class RecordingStream(PartyStream):
    def ask(self, message: pb.LabelPartyMessage) -> None:
        self.log.append(("sent", self.party_id))
        super().ask(message)


def batch(step: int) -> Batch:
    return Batch(phase=Phase.TRAIN, epoch=0, step=step, sample_ids=np.arange(4, dtype=np.int64))


def answer(step: int) -> pb.PartyMessage:
    return pb.PartyMessage(phase=pb.TRAIN, step=step, activation=encode_tensor(torch.ones(4, 3)))


def test_slowest_party_first_and_the_update_while_the_parties_compute() -> None:
    log: list[tuple[str, int]] = []
    streams = {k: RecordingStream(k) for k in (1, 2, 3)}
    for stream in streams.values():
        stream.log = log  # type: ignore[attr-defined]
    session = SimpleNamespace(cfg=load_config(None), streams=streams,
                              embedding_shapes=lambda: {k: (3,) for k in streams})
    exchange = NetworkExchange(session)  # type: ignore[arg-type]

    async def step(n: int, arrival: list[int]) -> dict[int, torch.Tensor]:
        async def parties() -> None:
            await asyncio.sleep(0.01)  # the answers come after the label party's update
            for k in arrival:
                log.append(("answered", k))
                await streams[k].inbound.put(answer(n))
                await asyncio.sleep(0.01)

        answering = asyncio.create_task(parties())
        got = await exchange.exchange(None, None, batch(n),
                                      meanwhile=lambda: log.append(("update", 0)))
        await answering
        return got

    async def steps() -> None:
        got = await step(0, [2, 3, 1])
        assert sorted(got) == [1, 2, 3]
        assert all(torch.equal(a, torch.ones(4, 3)) for a in got.values())
        assert log[:4] == [("sent", 1), ("sent", 2), ("sent", 3), ("update", 0)]
        log.clear()
        await step(1, [3, 2, 1])
        # party 1 answered last, then 3, then 2: the next messages go out in that order
        assert log[:4] == [("sent", 1), ("sent", 3), ("sent", 2), ("update", 0)]
        log.clear()
        await step(2, [1, 2, 3])
        assert log[:3] == [("sent", 1), ("sent", 2), ("sent", 3)]
        log.clear()
        await step(3, [1, 2, 3])
        assert log[:3] == [("sent", 3), ("sent", 2), ("sent", 1)]

    asyncio.run(steps())
