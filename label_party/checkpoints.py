"""The label party's side of coordinated checkpoints (DESIGN.md §9): ask, wait, write last."""

from __future__ import annotations

import logging
from typing import Any

import torch

from label_party.driver import Compute, Progress
from label_party.exchange import NetworkExchange
from label_party.schedule import Batch, Phase
from label_party.session import SessionError
from label_party.trainer import LabelPartyTrainer
from splitleak.artifacts.manifest import write_manifest
from splitleak.artifacts.metrics import MetricsWriter
from splitleak.artifacts.paths import RunDir, checkpoint_party_file
from splitleak.checkpoint import (
    LABEL_PARTY_FILE,
    Manifest,
    Position,
    load_state,
    prune,
    rng_state,
    save_state,
    set_rng_state,
    step_dir,
)
from splitleak.config import ExperimentConfig
from splitleak.data_files import data_files
from splitleak.fileio import describe_os_error

log = logging.getLogger("label_party")
FAILURE_DEADLINE = 10.0  # s: a checkpoint after a failure waits at most this for the parties


class Interrupted(Exception):
    """The run was asked to stop (SIGTERM, Ctrl-C) and stopped at a checkpoint."""

    def __init__(self, position: Position | None) -> None:
        super().__init__(f"interrupted at step {position.step}" if position else "interrupted")
        self.position = position


class RunCheckpoints:
    """Every `training.checkpoint_every` train steps, when the run is interrupted, and after a
    failure that left every party connected: each party writes its state and acknowledges,
    then this party writes its own state and the manifest, last."""

    def __init__(self, cfg: ExperimentConfig, run: RunDir, exchange: NetworkExchange,
                 trainer: LabelPartyTrainer, metrics: MetricsWriter, compute: Compute,
                 progress: Progress) -> None:
        self.cfg = cfg
        self.run = run
        self.exchange = exchange
        self.trainer = trainer
        self.metrics = metrics
        self.compute = compute
        self.progress = progress
        self.every = cfg.training.checkpoint_every
        self.total = exchange.session.data.plan.total_train_steps
        self.interrupt_requested = False
        self.last: Position | None = progress.start if progress.start.batches else None
        self.data = data_files(cfg)  # what a resume must train on again

    def due(self, position: Position, batch: Batch) -> bool:
        if self.interrupt_requested:
            return True
        periodic = (self.every and batch.phase is Phase.TRAIN and position.step % self.every == 0
                    and 0 < position.step < self.total)
        return bool(periodic) and position != self.last

    async def take(self, position: Position, gradients: dict[int, torch.Tensor] | None,
                   gradient_batch: Batch | None, reason: str | None = None,
                   deadline: float | None = None) -> Manifest:
        reason = reason or ("interrupted" if self.interrupt_requested else "periodic")
        acks = await self.exchange.checkpoint(gradients, gradient_batch, position, deadline,
                                              late_answers=reason == "failed")
        if self.exchange.taps is not None:  # the label party's own records, durable first
            await self.exchange.taps.sync(position.step)
        self.metrics.sync()  # the manifest must never count records the disk does not hold
        manifest = await self.compute(self._write, position, acks, reason)
        self.last = position
        log.info("checkpoint at step %d (%s): %s", position.step, reason,
                 step_dir(self.run.root, position))
        if self.interrupt_requested and reason != "failed":
            raise Interrupted(position)
        return manifest

    def _write(self, position: Position, acks: dict[int, Any], reason: str) -> Manifest:
        directory = step_dir(self.run.root, position)
        files = {checkpoint_party_file(k): ack.sha256 for k, ack in sorted(acks.items())}
        files[LABEL_PARTY_FILE] = save_state(directory / LABEL_PARTY_FILE, {
            "trainer": self.trainer.state_dict(), "rng": rng_state()})
        manifest = Manifest(
            step=position.step, batches=position.batches, metrics_records=self.metrics.records,
            run_id=self.run.root.name, config_hash=self.cfg.hash,
            config=self.cfg.model_dump(mode="json"), files=files,
            recorded={str(k): int(ack.recorded) for k, ack in sorted(acks.items())
                      if ack.recorded}, reason=reason, data=self.data)
        write_manifest(self.run, manifest)
        prune(self.run.root)
        return manifest

    async def after_failure(self, error: SessionError, connected: bool) -> Manifest | None:
        """A checkpoint at the last boundary, if the trainer still holds that state and every
        party can still answer (a party that died or stalled cannot: nothing is written)."""
        position = self.progress.boundary
        if not (self.every and connected and self.progress.intact) or position == self.last or (
                error.code.name == "DEADLINE_EXCEEDED"):
            return None  # checkpoints are off, or a party cannot answer, or nothing is new
        try:
            return await self.take(position, None, None, reason="failed",
                                   deadline=min(FAILURE_DEADLINE, self.cfg.topology.step_deadline_s))
        except SessionError as err:
            log.warning("no checkpoint after the failure: %s", err.message)
            return None
        except OSError as err:  # e.g. the disk the failure itself filled: the failure is the news
            log.warning("no checkpoint after the failure: %s", describe_os_error(err))
            return None


def restore(trainer: LabelPartyTrainer, run: RunDir, manifest: Manifest) -> None:
    """Load the label party's state of a complete checkpoint (its hash checked)."""
    state = load_state(step_dir(run.root, manifest.position) / LABEL_PARTY_FILE,
                       manifest.files[LABEL_PARTY_FILE])
    trainer.load_state_dict(state["trainer"])
    set_rng_state(state["rng"])
