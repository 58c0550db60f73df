"""`label-party serve`: load labels, serve the session until the run ends, leave the outputs."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from label_party.checkpoints import Interrupted, RunCheckpoints, restore
from label_party.driver import Progress, call_inline, drive
from label_party.exchange import NetworkExchange
from label_party.outputs import (
    clean_anchor_writer,
    snapshot_writer,
    write_labels,
    write_outputs,
)
from label_party.schedule import Batch, schedule
from label_party.servicer import add_label_party
from label_party.session import Session, SessionError
from label_party.setup import LabelPartyData, load_label_party_data, plan_record
from label_party.taps import ReceivedTaps, sidecar_failed
from label_party.trainer import LabelPartyTrainer, NonFiniteStep
from splitleak.addresses import resolve
from splitleak.artifacts.metrics import MetricsWriter
from splitleak.artifacts.outcome import write_outcome
from splitleak.artifacts.paths import RunDir
from splitleak.checkpoint import (
    CheckpointError,
    Manifest,
    Position,
    discard_after,
    newest_fields,
)
from splitleak.cli_common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED
from splitleak.config import ExperimentConfig
from splitleak.fileio import describe_os_error, write_atomically
from splitleak.integrity import variant_rows
from splitleak.lifeline import orphaned
from splitleak.placement import LABEL, label_core_free, memory_facts, prepare_role
from splitleak.provenance import PluginError
from splitleak.tap import TapError
from splitleak.timing import mark_startup, note
from splitleak.tls import LABEL_PARTY
from splitleak.transport import bind, create_server
from splitleak.validation import resolved
from splitleak.watchdog import (
    STUCK_GRACE,
    Heartbeat,
    Stuck,
    Watchdog,
    end_stuck,
    resume_hint,
    step_limit,
    stuck_sentence,
    suspects,
)

log = logging.getLogger("label_party")
SERVICE_NAME = "splitleak.v1.LabelParty"


async def serve(cfg: ExperimentConfig, run: RunDir, listen: str,
                port_file: Path | None = None, tls_dir: Path | None = None,
                resuming: bool = False, manifest: Manifest | None = None,
                attacker: str | None = None) -> int:
    """Serve one run (or resume it from `manifest`, or from step 0 in the same directory);
    with `attacker`, tap what it receives from the threat model's receiver victims to that
    sidecar. Returns the process exit code (0 trained, 1 failed, 2 run directory unusable,
    130 stopped)."""
    serving = await start(cfg, run, listen, tls_dir, resuming, manifest, attacker)
    if port_file is not None:
        write_atomically(port_file, lambda tmp: tmp.write_text(f"{serving.address}\n"))
    # Signals reach only the main thread; a label party run in a worker thread (a Ray role
    # actor) is stopped by ending its process instead, and is not ended by its watchdog.
    own_process = threading.current_thread() is threading.main_thread()
    outcome = await serving.until_done(handle_signals=own_process, watch=own_process)
    if outcome["status"] == "ok":
        log.info("training finished: ok (%s train steps in %.1f s)", outcome.get("train_steps"),
                 outcome["seconds"])
        return 0
    log.error("training finished: %s (%s)", outcome["status"], outcome["message"])
    if outcome["status"] == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_BAD_INPUT if outcome.get("output_error") or outcome.get("plugin_error") else EXIT_FAILED


@dataclass
class Serving:
    """A started label party: its server, and the run it serves."""

    server: grpc.aio.Server
    health: health.aio.HealthServicer
    labelled: LabelPartyRun
    address: str

    async def until_done(self, handle_signals: bool = False, watch: bool = False) -> dict[str, Any]:
        """Run to the end, write the outcome, stop serving; returns the outcome. `watch`: a
        step stuck past its deadline ends this process (LabelPartyRun.stuck)."""
        labelled = self.labelled
        outcome = await labelled.until_done(handle_signals, watch)
        labelled.writer.close()
        try:
            write_outcome(labelled.run, outcome)
        except OSError as err:
            log.error("%s", describe_os_error(err))
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace=3.0 if outcome["status"] == "ok" else 1.0)
        labelled.session.refusals.flush()
        return outcome


async def start(cfg: ExperimentConfig, run: RunDir, listen: str, tls_dir: Path | None = None,
                resuming: bool = False, manifest: Manifest | None = None,
                attacker: str | None = None) -> Serving:
    """Load the labels, write them, and start serving the run's session."""
    cfg = resolved(cfg)  # a CLI's config already is; one built in code is validated here
    device = prepare_role(cfg, LABEL)
    log.info("loading data (%s); computing on %s with %d thread(s)…", cfg.dataset.name, device,
             torch.get_num_threads())
    note(device=str(device), threads=torch.get_num_threads())
    data = load_label_party_data(cfg)
    if resuming:
        run.outcome.unlink(missing_ok=True)  # the interrupted attempt's; this one writes anew
        discard_after(run.root, manifest.position if manifest else None)
    write_labels(run, data, cfg)  # the ground truth is there for the analysis even if the run fails
    keep = manifest.metrics_records if manifest else (0 if resuming else None)
    writer = MetricsWriter(run.metrics, keep)
    if manifest is not None and writer.records != manifest.metrics_records:
        raise CheckpointError(f"{run.metrics} holds {writer.records} records but the checkpoint "
                              f"of step {manifest.step} counts {manifest.metrics_records}")
    session = Session(cfg, data, run.root.name, manifest, resuming)
    server = create_server(cfg.topology, cfg.wire.compression)
    add_label_party(server, session)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = bind(server, listen, tls_dir, LABEL_PARTY)
    await server.start()
    mark_startup("serving")
    serving = health_pb2.HealthCheckResponse.SERVING
    await health_servicer.set(SERVICE_NAME, serving)
    await health_servicer.set("", serving)
    host = listen.rsplit(":", 1)[0]
    log.info("label party listening on %s:%d (run %s%s)", host, port, run.root.name,
             f", resuming at step {manifest.step}" if manifest else ", resuming at step 0"
             if resuming else "")
    if attacker and cfg.received_parties:  # the sidecar may still be starting
        attacker = await resolve(attacker, "attacker sidecar", cfg.topology.join_deadline_s)
    taps = ReceivedTaps(cfg, attacker, tls_dir) if attacker and cfg.received_parties else None
    if cfg.received_parties and taps is None:
        log.warning("threat.receiver.victims = %s, but no --attacker sidecar was given: what this "
                    "party receives from them is not recorded (the reconstruction attacks will "
                    "have nothing to read)", cfg.received_parties)
    labelled = LabelPartyRun(cfg, run, session, data, writer,
                             Progress(start=manifest.position if manifest else Position(0, 0)), taps,
                             device)
    return Serving(server, health_servicer, labelled, f"{host}:{port}")


class LabelPartyRun:
    """The run's life: wait for the parties, train, and end with an outcome in every case."""

    def __init__(self, cfg: ExperimentConfig, run: RunDir, session: Session, data: LabelPartyData,
                 writer: MetricsWriter, progress: Progress, taps: ReceivedTaps | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.cfg, self.run, self.session, self.data = cfg, run, session, data
        self.device = torch.device(device)
        self.taps = taps
        self.writer = writer
        self.progress = progress
        self.checkpoints: RunCheckpoints | None = None
        self.signals = 0
        self.task: asyncio.Task | None = None
        self.started = time.monotonic()
        self.heartbeat = Heartbeat()  # the batch in the label party's hands (NetworkExchange)
        self.trainer: LabelPartyTrainer | None = None

    async def until_done(self, handle_signals: bool = True, watch: bool = False) -> dict[str, Any]:
        """The outcome; with `handle_signals`, SIGTERM / SIGINT interrupt the run cleanly;
        with `watch`, a step stuck past its deadline ends the process (`stuck`)."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.interrupt)
        watchdog = Watchdog(self.heartbeat, self.cfg.topology.step_deadline_s + STUCK_GRACE,
                            self.stuck, self._plugins).start() if watch else None
        self.task = asyncio.ensure_future(self._run())
        if self.signals:  # stopped before it began
            self.task.cancel()
        try:
            return await self.task
        except asyncio.CancelledError:
            self.session.abort(SessionError(grpc.StatusCode.ABORTED, "the label party was stopped"))
            await self.session.wait_closed(timeout=2.0)
            return self._ended("interrupted", "the label party was stopped before a checkpoint")
        finally:
            if watchdog is not None:
                watchdog.stop()
            for sig in signals:
                loop.remove_signal_handler(sig)

    def _plugins(self) -> dict[str, str]:
        return suspects(self.trainer.plugins()) if self.trainer is not None else {}

    def stuck(self, stuck: Stuck) -> None:
        """The watchdog's last word (in its thread: the event loop is the one stuck): the
        outcome names where the step is stuck, and the process ends, its checkpoints kept (the
        parties see its streams end: the run stops within the step deadline)."""
        batch = stuck.beat
        doing = f"at {batch.phase.name} step {batch.step}" if isinstance(batch, Batch) else "in a step"
        resume = newest_fields(self.run.root)["checkpoint_step"]
        message = stuck_sentence("the label party", doing, stuck,
                                 step_limit(self.cfg.topology.step_deadline_s),
                                 resume_hint(self.run.root, resume))
        outcome = self._ended("failed", message, code=grpc.StatusCode.DEADLINE_EXCEEDED.name,
                              culprit="label party", party=None,
                              step=batch.step if isinstance(batch, Batch) else None)
        if stuck.plugin:
            outcome["plugin_error"] = True
        try:
            write_outcome(self.run, outcome)
        except OSError as err:
            log.error("%s", describe_os_error(err))
        end_stuck(log, message, stuck.plugin)

    def interrupt(self) -> None:
        """First signal: stop at the next boundary, after a checkpoint; second: stop now."""
        self.signals += 1
        if self.checkpoints is not None and self.signals == 1:
            log.warning("interrupted: stopping at the next step boundary, after a checkpoint "
                        "(signal again to stop at once)")
            self.checkpoints.interrupt_requested = True
        elif self.task is not None:
            self.task.cancel()

    async def _run(self) -> dict[str, Any]:
        compute = call_inline  # label_party.driver says why the step runs on the event loop
        cfg, session, data = self.cfg, self.session, self.data
        if self.writer.records == 0:
            self.writer.write(plan_record(data, len(session.party_ids), cfg.run.seed))
        exchange: NetworkExchange | None = None
        anchors = clean_anchor_writer(self.run, cfg)
        snapshots = snapshot_writer(self.run, cfg)
        try:
            await session.wait_for_parties()
            trainer = await compute(LabelPartyTrainer, cfg, data.labels, data.num_classes,
                                    session.embedding_shapes(), data.own_inputs, data.train_ids,
                                    anchors, snapshots, self.device, label_core_free(cfg))
            self.trainer = trainer
            note(split_backward=trainer.objective.split_backward)
            if session.resume is not None:
                await compute(restore, trainer, self.run, session.resume)
            resumed_at = session.resume.step if session.resume else 0
            for artifact in (anchors, snapshots):  # a resumed run redoes the steps after its checkpoint
                if artifact is not None:
                    await compute(artifact.keep_before, resumed_at)
            if self.taps is not None:
                await self.taps.start(session.run_id, resumed_at if session.resumed else None)
            exchange = NetworkExchange(session, self.taps, self.heartbeat)
            self.checkpoints = RunCheckpoints(cfg, self.run, exchange, trainer, self.writer,
                                              compute, self.progress)
            batches = schedule(data.plan, data.train_ids, data.test_ids, cfg.run.seed,
                               variant_rows(cfg.threat, data.test_ids, cfg.run.seed))
            await drive(trainer, batches, exchange, self.writer.write, compute, self.checkpoints,
                        self.progress, exchange.timer)
            note(**memory_facts(self.device))
            exchange.timer.write(self.run.label_timing, per="compute")
            await compute(write_outputs, self.run, trainer)
            await session.wait_closed(timeout=cfg.topology.step_deadline_s)
            tapped = await self._close_taps()
            return {**self._ended("ok"), **tapped, "train_steps": data.plan.total_train_steps,
                    "resumed_from": (session.resume.step if session.resume else 0)
                    if session.resumed else None,
                    "bytes_sent": exchange.bytes_sent, "bytes_received": exchange.bytes_received,
                    "embedding_shapes": {k: list(v) for k, v in session.embedding_shapes().items()},
                    "defenses": trainer.defense_summary(),
                    "objective": trainer.objective_summary()}
        except Interrupted as stop:
            self.heartbeat.beat = None  # stopping: no step is computed any more
            message = (f"the run was interrupted at step {self.progress.boundary.step}; resume it "
                       f"with --resume {self.run.root}")
            session.abort(SessionError(grpc.StatusCode.ABORTED, message))
            await session.wait_closed(timeout=2.0)
            await self._stop_taps(message, resumable=True)
            return self._ended("interrupted", message, step=stop.position.step if stop.position
                               else None)
        except SessionError as err:
            return await self._failed(err)
        except TapError as err:
            return await self._failed(sidecar_failed(err))
        except NonFiniteStep as err:
            return await self._failed(SessionError(grpc.StatusCode.INVALID_ARGUMENT, str(err),
                                                   err.party_id))
        except PluginError as err:  # an installed objective or defense broke: its one sentence
            log.error("%s", err)
            outcome = await self._failed(SessionError(grpc.StatusCode.FAILED_PRECONDITION, str(err)))
            return {**outcome, "plugin_error": True}
        except OSError as err:
            message = describe_os_error(err)
            log.error("the label party cannot go on: %s", message)
            outcome = await self._failed(SessionError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the label party cannot write its run directory: {message}"))
            return {**outcome, "output_error": True}
        except CheckpointError as err:  # reading a checkpoint back: never a write problem
            log.error("the label party cannot resume: %s", err)
            return await self._failed(SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                                                   f"the label party cannot resume: {err}"))
        except Exception as err:  # noqa: BLE001 - a bug here must still end every party's stream
            log.exception("label party failed")
            return await self._failed(SessionError(
                grpc.StatusCode.INTERNAL, f"label party internal error: {type(err).__name__}: {err}"))
        finally:
            self.heartbeat.beat = None  # a second signal cancelled the step: no step is timed
            if anchors is not None:
                anchors.close()
            # still open only when the run was cancelled (a second signal): stopped, resumable
            await self._stop_taps("the label party was stopped", resumable=True)

    async def _close_taps(self) -> dict[str, Any]:
        """End the label party's Record streams (once); what each sidecar acknowledged."""
        taps, self.taps = self.taps, None
        if taps is None:
            return {}
        reports = await taps.close()
        return {"received_tap": {str(k): r for k, r in reports.items()}}

    async def _stop_taps(self, reason: str, resumable: bool) -> None:
        """End the label party's Record streams (once), telling the sidecar why the run ended
        before it was done."""
        taps, self.taps = self.taps, None
        if taps is not None:
            await taps.stop(reason, resumable)

    async def _failed(self, error: SessionError) -> dict[str, Any]:
        """Checkpoint what can be (every party still there), then end every stream. A party
        lost while the run is being stopped (a signal here, or the orchestrator gone: every
        process got the same signal) broke nothing: the run was interrupted."""
        self.heartbeat.beat = None  # the step is over: what follows waits on its own deadlines
        stopping = ("the label party was signalled to stop" if self.signals else
                    "the process that started the label party ended" if orphaned() else None)
        if stopping is not None:
            self.session.abort(SessionError(grpc.StatusCode.ABORTED, stopping))
            await self.session.wait_closed(timeout=2.0)
            message = f"{stopping} (meanwhile: {error.message})"
            await self._stop_taps(message, resumable=True)
            return self._ended("interrupted", message, step=self.progress.boundary.step)
        if self.checkpoints is not None:
            await self.checkpoints.after_failure(error, self.session.all_connected)
        self.session.abort(error)
        await self.session.wait_closed(timeout=2.0)
        await self._stop_taps(error.message, resumable=False)
        batch = self.progress.batch
        return self._ended("failed", error.message, code=error.code.name, party=error.party_id,
                           culprit=error.culprit,
                           step=batch.step if batch is not None else self.progress.boundary.step)

    def _ended(self, status: str, message: str | None = None, **fields: Any) -> dict[str, Any]:
        outcome: dict[str, Any] = {"status": status, "seconds": time.monotonic() - self.started}
        if message is not None:
            outcome["message"] = message
        outcome.update(fields)
        if status != "ok":
            outcome.update(newest_fields(self.run.root))
        return outcome
