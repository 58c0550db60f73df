"""The step loop, written once: the same for the gRPC session and the in-process reference."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from label_party.schedule import Batch, Phase
from label_party.trainer import LabelPartyTrainer
from splitleak.checkpoint import Position
from splitleak.heap import freeze_start_up
from splitleak.timing import StepTimer, timed


class Exchange(Protocol):
    """How activations and cut gradients travel between the label party and the parties."""

    async def exchange(self, gradients: dict[int, torch.Tensor] | None, gradient_batch: Batch | None,
                       next_batch: Batch, meanwhile: Callable[[], object] | None = None,
                       ) -> dict[int, torch.Tensor]:
        """Deliver the previous train batch's gradients (if any) with the next batch's ids;
        return every party's activation for `next_batch`. `meanwhile`: the label party's own
        work to run once the messages are on their way, while the parties compute."""

    async def finish(self, gradients: dict[int, torch.Tensor] | None,
                     gradient_batch: Batch | None) -> None:
        """Deliver the last gradients and tell every party that training is over."""


class Checkpoints(Protocol):
    """Coordinated checkpoints at boundaries of the schedule (label_party/checkpoints.py)."""

    def due(self, position: Position, batch: Batch) -> bool:
        """Take a checkpoint before `batch`? (periodic, or the run is being interrupted)"""

    async def take(self, position: Position, gradients: dict[int, torch.Tensor] | None,
                   gradient_batch: Batch | None) -> object:
        """Deliver the pending gradients, have every party checkpoint, write the manifest."""


Compute = Callable[..., Awaitable[Any]]


@dataclass
class Progress:
    """Where the loop is; read by whoever must describe or checkpoint a run that stopped."""

    start: Position = Position(0, 0)  # a resumed run skips the batches before this
    boundary: Position = Position(0, 0)  # the last boundary passed (train batch or eval pass)
    batch: Batch | None = None  # the batch in flight
    # The trainer still holds its state of `boundary` (nothing trained since): a checkpoint
    # at `boundary` can be taken after a failure.
    intact: bool = True


async def call_inline(fn: Callable[..., Any], *args: Any) -> Any:
    """Run the step's work on the event loop itself. A step is synchronous: while the label
    party computes, every party waits for its gradient and nothing else needs serving (gRPC's
    own threads keep the connections alive), and handing the work to a thread and back cost
    more than a millisecond a step (5 % more steps/s inline: 4 interleaved rounds at nice -15
    on 2 cores, label party and one passive party)."""
    return fn(*args)


async def drive(trainer: LabelPartyTrainer, batches: Iterable[Batch], exchange: Exchange,
                sink: Callable[[dict], None], compute: Compute = call_inline,
                checkpoints: Checkpoints | None = None, progress: Progress | None = None,
                timer: StepTimer | None = None) -> None:
    """Run the schedule: one exchange per batch, gradients piggy-backed on the next batch.

    A boundary is a train batch or the first batch of an evaluation pass; a checkpoint is only
    taken there, so it never holds half an evaluation. A train step's update of the label
    party's own parameters runs during the next exchange, once its gradients are on their way
    (the trainer applies it first wherever the parameters are read). `timer`: train steps'
    time split into `exchange` (sending, the pending update, waiting for the parties,
    decoding) and `compute` (the label's step up to its cut gradients)."""
    timer = timer or StepTimer()
    progress = progress or Progress()
    freeze_start_up()
    started = time.monotonic()
    pending: dict[int, torch.Tensor] | None = None
    pending_batch: Batch | None = None
    previous: Phase | None = None
    for index, batch in enumerate(batches):
        if index < progress.start.batches:
            previous = batch.phase
            continue  # done before the checkpoint this run resumes from
        if batch.phase is Phase.TRAIN or previous is not Phase.EVAL:
            progress.boundary, progress.intact = Position(batch.step, index), True
            if checkpoints is not None and checkpoints.due(progress.boundary, batch):
                await checkpoints.take(progress.boundary, pending, pending_batch)
                pending, pending_batch = None, None
        previous = batch.phase
        progress.batch = batch
        train = batch.phase is Phase.TRAIN
        with timer.span("exchange", timed(train, batch.step)):
            activations = await exchange.exchange(pending, pending_batch, batch, trainer.update)
        if train:
            progress.intact = False
            with timer.span("compute", timed(train, batch.step)):
                pending, record = await compute(trainer.train_step, batch, activations)
            pending_batch = batch
        else:
            pending, pending_batch = None, None
            record = await compute(trainer.eval_step, batch, activations)
        if record is not None:
            record["wall"] = round(time.monotonic() - started, 6)  # seconds since the first batch
            sink(record)
    progress.batch = None
    await exchange.finish(pending, pending_batch)
