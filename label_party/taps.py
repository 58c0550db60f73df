"""The label party's taps ([threat.receiver]): every activation it receives from a victim party,
exactly as it came off the wire, to the attacker sidecar (the label party as attacker)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc

from label_party.schedule import Batch
from label_party.session import SessionError
from splitleak.codec import encode_ids
from splitleak.config import ExperimentConfig
from splitleak.tap import SIDECAR, Tap, TapError
from splitleak.tls import LABEL_PARTY
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import tensor_pb2

log = logging.getLogger("label_party")


def sidecar_failed(err: TapError) -> SessionError:
    """A sidecar the run may not go on without (attacker.on_sidecar_failure = 'fail')."""
    return SessionError(grpc.StatusCode.UNAVAILABLE, f"{SIDECAR} failed (the label party's tap): "
                        f"{err}", culprit=SIDECAR)


class ReceivedTaps:
    """One Record stream per victim, opened when the run starts (cut back to a resumed step),
    synced at every checkpoint, closed when the run ends."""

    def __init__(self, cfg: ExperimentConfig, address: str, tls_dir: Path | None) -> None:
        self.taps = {k: Tap(address, cfg.attacker, cfg.topology, tls_dir, LABEL_PARTY,
                            observer=apb.LABEL_PARTY, config_hash=cfg.hash)
                     for k in cfg.received_parties}
        self.run_id = ""

    async def start(self, run_id: str, rewind_to: int | None) -> None:
        self.run_id = run_id
        for k, tap in self.taps.items():
            await tap.start(run_id, k, rewind_to)

    async def record(self, batch: Batch, received: dict[int, tensor_pb2.Tensor]) -> None:
        """The activations of one train step, as received (no decode, no copy of the values)."""
        ids = encode_ids(batch.sample_ids)
        for k, tap in self.taps.items():
            await tap.record(apb.GradientRecord(
                run_id=self.run_id, party_id=k, epoch=batch.epoch, step=batch.step, sample_ids=ids,
                activation=received[k], observer=apb.LABEL_PARTY))

    async def sync(self, step: int) -> dict[int, int]:
        """Every record of steps < `step` durable in the sidecar's log (a checkpoint)."""
        return {k: await tap.sync(step) for k, tap in self.taps.items()}

    async def stop(self, reason: str, resumable: bool) -> None:
        """Tell the sidecar why the run ends before it is done, on every stream (at once: each
        is bounded by splitleak.tap.STOP_S), and close them."""
        await asyncio.gather(*(tap.stop(reason, resumable) for tap in self.taps.values()))

    async def close(self) -> dict[int, dict[str, Any]]:
        reports = {}
        for k, tap in self.taps.items():
            try:
                reports[k] = (await tap.close()).as_dict()
            except TapError as err:
                reports[k] = {"error": str(err)}
                log.error("the label party's tap of party %d: %s", k, err)
        return reports
