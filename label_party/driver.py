"""The step loop, written once: the same for the gRPC session and the in-process reference."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import torch

from label_party.schedule import Batch, Phase
from label_party.trainer import LabelPartyTrainer


class Exchange(Protocol):
    """How activations and cut gradients travel between the label party and the parties."""

    async def exchange(self, gradients: dict[int, torch.Tensor] | None, gradient_batch: Batch | None,
                       next_batch: Batch) -> dict[int, torch.Tensor]:
        """Deliver the previous train batch's gradients (if any) with the next batch's ids;
        return every party's activation for `next_batch`."""

    async def finish(self, gradients: dict[int, torch.Tensor] | None,
                     gradient_batch: Batch | None) -> None:
        """Deliver the last gradients and tell every party that training is over."""


Compute = Callable[..., Awaitable[Any]]


async def call_inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


async def drive(trainer: LabelPartyTrainer, batches: Iterable[Batch], exchange: Exchange,
                sink: Callable[[dict], None], compute: Compute = call_inline) -> None:
    """Run the schedule: one exchange per batch, gradients piggy-backed on the next batch."""
    started = time.monotonic()
    pending: dict[int, torch.Tensor] | None = None
    pending_batch: Batch | None = None
    for batch in batches:
        activations = await exchange.exchange(pending, pending_batch, batch)
        if batch.phase is Phase.TRAIN:
            pending, record = await compute(trainer.train_step, batch, activations)
            pending_batch = batch
        else:
            pending, pending_batch = None, None
            record = await compute(trainer.eval_step, batch, activations)
        if record is not None:
            record["wall"] = round(time.monotonic() - started, 6)  # seconds since the first batch
            sink(record)
    await exchange.finish(pending, pending_batch)
