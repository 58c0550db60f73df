"""`passive-party run`: join the label party, then answer its Train stream until it says done."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import grpc
import numpy as np
import torch

from passive_party.bottom_trainer import BottomTrainer
from passive_party.integrity import party_integrity
from passive_party.protection import protect_party, stuck_protecting, write_figures
from passive_party.protections.base import ProtectionFailed
from splitleak.addresses import AddressError, resolve
from splitleak.artifacts.manifest import DataFile
from splitleak.artifacts.paths import RunDir, checkpoint_party_file
from splitleak.artifacts.records import write_tap_report
from splitleak.checkpoint import (
    CheckpointError,
    Position,
    load_state,
    newest_fields,
    prune_own,
    rng_state,
    save_state,
    set_rng_state,
    step_dir,
)
from splitleak.codec import WIRE_FLOATS, CodecError, decode_ids, decode_tensor, encode_tensor
from splitleak.config import PROTOCOL_VERSION, ConfigError, ExperimentConfig, WireConfig
from splitleak.data_files import data_changes, data_digests, data_files, describe
from splitleak.datasets import build_dataset
from splitleak.fileio import describe_os_error
from splitleak.heap import freeze_start_up
from splitleak.inputs import load_party_inputs
from splitleak.integrity import VARIANTS
from splitleak.partition import passive_columns
from splitleak.placement import memory_facts, prepare_role
from splitleak.tap import SIDECAR, STOP_S, Tap, TapError
from splitleak.timing import StepTimer, mark_startup, note, timed
from splitleak.tls import LABEL_PARTY, passive_identity
from splitleak.transport import (
    CLOSED_IN_A_ROW,
    PARTY_ID_KEY,
    SESSION_KEY,
    closed_unanswered,
    create_channel,
    own_certificate_refused,
    plaintext_against_tls,
    refused_server,
    tls_refusal,
)
from splitleak.v1 import attacker_pb2 as apb
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc
from splitleak.v1 import tensor_pb2
from splitleak.watchdog import Stuck, end_stuck, resume_hint
from splitleak.white_box import SnapshotWriter, cafe_victim
from splitleak.wire import config_map_problem

log = logging.getLogger("passive_party")
T = TypeVar("T")
JOIN_RETRY = 0.2  # s between two attempts to join a label party that does not answer yet


class PartyError(Exception):
    """This passive party cannot go on; the message says why."""


class PartyDataChanged(PartyError):
    """A resume would train on other data than this party's checkpoint: its own data file
    changed (or a relative path is read from another directory) since the run read it."""


class PartyStopped(Exception):
    """Stopped on its host (StopRequest) in training; the label party was told why."""


class StopRequest:
    """Set (by a signal handler) to stop the party. In training it stops at the label party's
    next message, telling it why (`why`), so the run's outcome and every other party name the
    stop rather than a dropped connection; `training` says whether it is there yet."""

    def __init__(self) -> None:
        self.why: str | None = None
        self.training = False
        self.checkpointing = False  # writing a checkpoint the label party asked for


def load_bottom(cfg: ExperimentConfig, party_id: int, capture_first_layer: bool = False,
                device: torch.device | str = "cpu") -> BottomTrainer:
    """Load only this party's columns (the dataset's label-free path) and build its model."""
    dataset = build_dataset(cfg.dataset.name, cfg.dataset.params)
    schema = dataset.schema()
    columns = passive_columns(cfg, schema)[party_id]
    inputs = load_party_inputs(cfg, dataset, columns)
    return BottomTrainer(cfg, party_id, inputs, cfg.output_width(schema.num_classes),
                         capture_first_layer, party_integrity(cfg, party_id, dataset, inputs),
                         device)


async def run_party(cfg: ExperimentConfig, party_id: int, address: str, run: RunDir,
                    bottom: BottomTrainer | None = None, attacker: str | None = None,
                    tls_dir: Path | None = None, resuming: bool = False,
                    stop: StopRequest | None = None, watch: bool = False) -> None:
    """Train this party's bottom model; with `attacker`, tap every received gradient to it.
    `resuming`: the label party may resume the run from a checkpoint in `run`; `stop`: set, it
    stops the party in training at the label party's next message (PartyStopped); `watch`: a
    protection stuck past topology.join_deadline_s ends this process, naming where."""
    if not 1 <= party_id <= cfg.topology.passive_parties:
        raise PartyError(f"--party-id {party_id} is not in this run's parties "
                         f"1..{cfg.topology.passive_parties}")
    made: list[Tap] = []  # the tap, once made
    try:
        await _prepare_and_train(cfg, party_id, address, run, bottom, attacker, tls_dir,
                                 resuming, stop, made, watch)
    except BaseException as err:  # noqa: BLE001 - re-raised: every way out tells the sidecar
        if attacker is not None:
            with contextlib.suppress(asyncio.CancelledError):  # a second stop: it is bounded
                await _tell_sidecar(made[0] if made else None, attacker, cfg, tls_dir, party_id,
                                    *_stop_reason(err, stop))
        raise


async def _tell_sidecar(tap: Tap | None, attacker: str, cfg: ExperimentConfig,
                        tls_dir: Path | None, party_id: int, reason: str, resumable: bool) -> None:
    """Say on the Record stream why this party stops before its run is done; a party that
    failed before its tap was made (its data, its Join) opens the stream for that alone, so
    the sidecar ends at once with the party's reason instead of waiting for a stream."""
    if tap is None:
        try:
            attacker = await resolve(attacker, SIDECAR, STOP_S)
        except AddressError:
            return  # no address written: no sidecar to tell
        tap = Tap(attacker, cfg.attacker, cfg.topology, tls_dir, passive_identity(party_id),
                  config_hash=cfg.hash)
    tap.party_id = tap.party_id or party_id
    await tap.stop(reason, resumable)


async def _prepare_and_train(cfg: ExperimentConfig, party_id: int, address: str, run: RunDir,
                             bottom: BottomTrainer | None, attacker: str | None,
                             tls_dir: Path | None, resuming: bool, stop: StopRequest | None,
                             made: list[Tap], watch: bool = False) -> None:
    """run_party's work; the tap it makes is put in `made` (for run_party to stop)."""
    tapped = attacker is not None
    data = data_files(cfg)  # what this party trains on, as its checkpoints record it
    if bottom is None:
        try:
            device = prepare_role(cfg, str(party_id))
        except ConfigError as err:
            raise PartyError(str(err)) from None
        log.info("party %d computes on %s with %d thread(s)", party_id, device,
                 torch.get_num_threads())
        note(device=str(device), threads=torch.get_num_threads())
        bottom = load_bottom(cfg, party_id, tapped and cfg.attacker.record_first_layer, device)
        mark_startup("ready")
        try:  # before joining: once, seeded
            write_figures(run, party_id, protect_party(
                cfg, bottom, _stuck_protecting(cfg, party_id, run) if watch else None))
        except (ConfigError, ProtectionFailed) as err:
            raise PartyError(str(err)) from None
    if cafe_victim(cfg, party_id):  # CAFE's threat model: the attacker sees its gradients
        bottom.snapshots = SnapshotWriter(run.bottom_white_box(party_id), cfg.threat)
    try:  # the label party and the sidecar may still be starting: their address files wait
        address = await resolve(address, "label party", cfg.topology.join_deadline_s)
        if attacker is not None:
            attacker = await resolve(attacker, SIDECAR, cfg.topology.join_deadline_s)
    except AddressError as err:
        raise PartyError(str(err)) from None
    if party_id in cfg.threat.malicious:  # the threat model's opt-in deviation (Fu et al.)
        log.info("party %d trains with the malicious optimizer: %s", party_id,
                 cfg.threat.describe([party_id]))
    tap = (Tap(attacker, cfg.attacker, cfg.topology, tls_dir, passive_identity(party_id),
               config_hash=cfg.hash) if attacker else None)
    made.extend([tap] if tap is not None else [])
    await _train(cfg, party_id, address, run, bottom, tap, tls_dir, resuming, stop, data)


def _stuck_protecting(cfg: ExperimentConfig, party_id: int, run: RunDir) -> Callable[[Stuck], None]:
    def stuck(stuck: Stuck) -> None:
        resume = newest_fields(run.root)["checkpoint_step"]
        end_stuck(log, stuck_protecting(cfg, party_id, stuck, resume_hint(run.root, resume)),
                  stuck.plugin)
    return stuck


async def _train(cfg: ExperimentConfig, party_id: int, address: str, run: RunDir,
                 bottom: BottomTrainer, tap: Tap | None, tls_dir: Path | None, resuming: bool,
                 stop: StopRequest | None, data: dict[str, DataFile] | None = None) -> None:
    """Join, train until the label party says done, save; close the tap's stream."""
    identity = passive_identity(party_id)
    async with create_channel(address, cfg.topology, tls_dir, identity,
                              server_identity=LABEL_PARTY,
                              compression=cfg.wire.compression) as channel:
        stub = pb_grpc.LabelPartyStub(channel)
        plan = await _join(stub, cfg, bottom, address, tls_dir)
        mark_startup("joined")
        log.info("party %d joined run %s: %d train steps%s", party_id, plan.run_id,
                 plan.total_train_steps,
                 f", resuming at step {plan.resume_step}" if plan.resumed else "")
        call = stub.Train(metadata=((PARTY_ID_KEY, str(party_id)), (SESSION_KEY, plan.session)))
        try:
            _restore(bottom, run, plan, resuming, cfg)
            if tap is not None:
                await tap.start(plan.run_id, party_id, plan.resume_step if plan.resumed else None)
        except (PartyError, TapError) as err:  # the label party hears why, at once
            await _report(call, SIDECAR if isinstance(err, TapError) else identity_name(party_id),
                          str(err))
            raise
        steps = StepLoop(bottom, tap, plan.run_id, run, cfg.wire, stop, data)
        await steps.run(call)
    bottom.save(run.bottom_model(party_id))
    note(**memory_facts(bottom.device), cuda_graphs=bottom.cuda_graphs)
    steps.timer.write(run.passive_timing(party_id), per="forward")
    if tap is not None:
        report = await tap.close()
        write_tap_report(run, party_id, report)
        if report.gap_records:
            log.warning("party %d: %d gradient record(s) were not recorded (from step %s): %s",
                        party_id, report.gap_records, report.gap_first_step, report.error)


def _stop_reason(err: BaseException, stop: StopRequest | None) -> tuple[str, bool]:
    """What the party tells its sidecar of a stop before its run is done: its own sentence (as
    its log says it), and whether it may be resumed (a stop was requested on its host)."""
    requested = stop.why if stop is not None else None
    if isinstance(err, PartyStopped | asyncio.CancelledError | KeyboardInterrupt):
        return requested or "stopped on its host before its run was done", True
    if isinstance(err, OSError):
        sentence = describe_os_error(err)
    elif isinstance(err, PartyError | TapError):
        sentence = str(err)
    else:
        sentence = f"{type(err).__name__}: {err}"
    return sentence, requested is not None


def identity_name(party_id: int) -> str:
    return f"passive party {party_id}"


def _restore(bottom: BottomTrainer, run: RunDir, plan: pb.TrainingPlan, resuming: bool,
             cfg: ExperimentConfig | None = None) -> None:
    """Load this party's checkpoint when the label party resumes the run from one, unless this
    party's own data files (`cfg`'s) are no longer those the checkpoint's run read: on another
    host, the label party's check of its own files says nothing of this party's."""
    if resuming and not plan.resumed:  # its checkpoints would be pruned by another run's
        raise PartyError(f"this party was started with --resume {run.root}, but the label party "
                         f"starts run {plan.run_id} afresh: start the label party with --resume "
                         "too, or this party with --run-dir for a new run (a new directory: "
                         f"{run.root} keeps the checkpoints of the run to resume)")
    if not plan.resumed or plan.resume_batches == 0:
        return
    if not resuming:
        raise PartyError(f"the label party resumes run {plan.run_id} at step {plan.resume_step}: "
                         "start this party with --resume RUN_DIR (the run directory holding its "
                         "checkpoints)")
    path = step_dir(run.root, Position(plan.resume_step, plan.resume_batches)) / checkpoint_party_file(
        bottom.party_id)
    try:
        state = load_state(path, plan.resume_sha256)
        trained = {key: DataFile.model_validate(file) for key, file in state.get("data", {}).items()}
    except (CheckpointError, ValueError) as err:
        raise PartyError(f"cannot resume at step {plan.resume_step}: {err}") from None
    changes = data_changes(trained, cfg) if cfg is not None else []
    if changes:  # refused before anything of the run is cut back
        raise PartyDataChanged(f"cannot resume at step {plan.resume_step} from {path}: "
                               f"{describe(changes)}")
    if bottom.snapshots is not None:  # the steps after the checkpoint are redone
        bottom.snapshots.keep_before(plan.resume_step)
    try:
        bottom.load_state_dict(state["bottom"])
    except (KeyError, ValueError, RuntimeError) as err:
        raise PartyError(f"cannot resume at step {plan.resume_step}: {err}") from None
    set_rng_state(state["rng"])


async def _join(stub: pb_grpc.LabelPartyStub, cfg: ExperimentConfig, bottom: BottomTrainer,
                address: str, tls_dir: Path | None) -> pb.TrainingPlan:
    fields = cfg.field_hashes()
    if config_map_problem("config_fields", fields) is not None:  # more than a label party reads
        fields = {}  # it names the sections that differ instead
    request = pb.JoinRequest(protocol_version=PROTOCOL_VERSION, party_id=bottom.party_id,
                             embedding_shape=bottom.embedding_shape, config_hash=cfg.hash,
                             num_rows=bottom.inputs.num_rows,
                             config_sections=cfg.section_hashes(), config_fields=fields,
                             data_digests=data_digests(cfg))
    # Until the label party listens, every attempt fails at once (UNAVAILABLE): try again
    # until the join deadline. A TLS handshake it refused cannot get better by waiting (not
    # waiting for the channel to be ready is what lets it show at once).
    end = time.monotonic() + cfg.topology.join_deadline_s
    closed = 0  # attempts in a row whose connection closed unanswered
    bottom_identity = passive_identity(bottom.party_id)
    waiting = False
    while True:
        try:
            return await stub.Join(request, timeout=max(0.001, end - time.monotonic()))
        except grpc.aio.AioRpcError as err:
            refusal = tls_refusal(err)
            if refusal is not None:
                raise PartyError(refused_server(refusal, "label party", address,
                                                "--label-party", tls_dir)) from None
            closed = closed + 1 if closed_unanswered(err) else 0
            if closed >= CLOSED_IN_A_ROW:  # with TLS: the label party refused our certificate
                raise PartyError(plaintext_against_tls("label party", address) if tls_dir is None
                                 else own_certificate_refused("label party", address, tls_dir,
                                                              bottom_identity)) from None
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise PartyError(_describe(err, "joining")) from None
            if time.monotonic() + JOIN_RETRY > end:
                raise PartyError(_nobody_at(address, cfg.topology.join_deadline_s, err)) from None
            if not waiting:  # one line: a wrong --label-party otherwise looked like a hang
                log.info("waiting up to %g s (topology.join_deadline_s) for the label party at "
                         "%s to answer", cfg.topology.join_deadline_s, address)
                waiting = True
        await asyncio.sleep(JOIN_RETRY)


class _Tapped(NamedTuple):
    """What the tap records of one train step, kept until the party has answered the next."""

    message: pb.LabelPartyMessage  # the cut gradient, its step and epoch
    batch: pb.Batch  # the step's sample ids
    activation: tensor_pb2.Tensor | None  # what the party sent, if recorded
    first_layer_gradient: torch.Tensor | None


class StepLoop:
    """Answers the label party: apply the gradient (if any), compute the asked batch and send
    it, then tap the gradient (off the step's critical path, while the label party computes);
    before a checkpoint or the end, the tap comes first, so the checkpoint counts the record.

    The model's work runs on the event loop itself: the party has nothing else to serve while
    it computes (the label party waits for its answer), and a hand-off to a worker thread and
    back cost more than a millisecond a step (measured: 5 % more steps/s inline, 4 interleaved
    rounds at nice -15 on 2 cores)."""

    def __init__(self, bottom: BottomTrainer, tap: Tap | None, run_id: str,
                 run_dir: RunDir | None = None, wire: WireConfig | None = None,
                 stop: StopRequest | None = None,
                 data: dict[str, DataFile] | None = None) -> None:
        self.bottom = bottom
        self.data = data or {}  # this party's data files, as each checkpoint records them
        self.stop = stop
        wire = wire or WireConfig()
        self.wire = WIRE_FLOATS[wire.dtype]  # what activations travel as, gradients come as
        self.sparse = wire.sparse  # activations as (indices, values) when that is smaller
        self.tap = tap
        self.run_id = run_id
        self.run_dir = run_dir  # where checkpoints go
        self._train_batch: pb.Batch | None = None  # the last TRAIN batch (its ids, epoch, step)
        self._train_activation: tensor_pb2.Tensor | None = None
        # Train steps' time: `wait` for the label party (its compute and the transport),
        # `decode` / `encode`, `backward` / `forward` (compute), `tap`, `write` (hand-over).
        self.timer = StepTimer()

    async def run(self, call: Any) -> None:
        ended = EndStatus(call)
        if self.stop is not None:
            self.stop.training = True
        freeze_start_up()
        try:
            while True:
                began = time.perf_counter()
                message = await call.read()
                if message is grpc.aio.EOF:
                    raise PartyError("the label party closed the stream before saying done")
                if self.stop is not None and self.stop.why is not None and not message.done \
                        and not message.HasField("checkpoint"):  # a checkpoint is still written
                    await _report(call, identity_name(self.bottom.party_id), self.stop.why)
                    raise PartyStopped(self.stop.why)
                train = timed(message.next_batch.phase == pb.TRAIN, message.next_batch.step)
                if train:
                    self.timer.add("wait", time.perf_counter() - began)
                tap = await self._apply(message) if message.HasField("cut_gradient") else None
                if tap is not None and (message.done or message.HasField("checkpoint")):
                    await self._tap(tap)  # first: the checkpoint's sync counts this record
                    tap = None
                if message.done:
                    await call.done_writing()
                    break
                if message.HasField("checkpoint"):
                    answer = await self._checkpointed(message.checkpoint)
                else:
                    answer = await self._answer(message.next_batch)
                with self.timer.span("write", train):
                    await _write(call, answer, ended)
                if tap is not None:  # off the step's critical path: the label party computes
                    await self._tap(tap)
            code = await call.code()
            if code != grpc.StatusCode.OK:
                raise PartyError(f"the label party ended the stream with {code.name}: "
                                 f"{await call.details()}")
        except grpc.aio.AioRpcError as err:
            raise PartyError(_describe(err, "training")) from None
        except TapError as err:
            await _report(call, SIDECAR, str(err))
            raise
        except OSError as err:  # e.g. its disk is full: its checkpoint cannot be written
            await _report(call, identity_name(self.bottom.party_id), describe_os_error(err))
            raise
        except PartyError:
            call.cancel()
            raise

    async def _apply(self, message: pb.LabelPartyMessage) -> _Tapped | None:
        """Apply the cut gradient; what the tap records of this step (None if nothing is
        tapped), taken before the next batch replaces the step's ids and activation."""
        on = timed(True, message.gradient_step)
        with self.timer.span("decode", on):
            gradient = _decode_gradient(message, self.bottom, self.wire)
        with self.timer.span("backward", on):
            self.bottom.backward(gradient)
        if self.tap is None or self._train_batch is None:
            return None
        return _Tapped(message, self._train_batch,
                       self._train_activation if self.tap.record_activation else None,
                       self.bottom.first_layer_gradient)

    async def _tap(self, tapped: _Tapped) -> None:
        message = tapped.message
        with self.timer.span("tap", timed(True, message.gradient_step)):
            record = apb.GradientRecord(run_id=self.run_id, party_id=self.bottom.party_id,
                                        epoch=message.gradient_epoch, step=message.gradient_step,
                                        sample_ids=tapped.batch.sample_ids,
                                        cut_gradient=message.cut_gradient)
            if tapped.activation is not None:
                record.activation.CopyFrom(tapped.activation)
            if tapped.first_layer_gradient is not None:
                record.first_layer_gradient.CopyFrom(encode_tensor(tapped.first_layer_gradient))
            assert self.tap is not None  # _apply hands out a _Tapped only to a tapped party
            await self.tap.record(record)

    async def _answer(self, batch: pb.Batch) -> pb.PartyMessage:
        train = batch.phase == pb.TRAIN
        on = timed(train, batch.step)
        with self.timer.span("decode", on):
            ids = _decode_batch_ids(batch, self.bottom.inputs.num_rows)
        with self.timer.span("forward", on):
            output = self.bottom.forward(ids, train, batch.epoch, batch.step, batch.variant)
        with self.timer.span("encode", on):
            activation = encode_tensor(output.to(self.wire), sparse=self.sparse)
        if train:
            self._train_batch, self._train_activation = batch, activation
        return pb.PartyMessage(phase=batch.phase, step=batch.step, activation=activation)

    async def _checkpointed(self, request: pb.CheckpointRequest) -> pb.PartyMessage:
        """_checkpoint, with a stop on this host held off until it is written."""
        if self.stop is None:
            return await self._checkpoint(request)
        self.stop.checkpointing = True
        try:
            return await self._checkpoint(request)
        finally:
            self.stop.checkpointing = False

    async def _checkpoint(self, request: pb.CheckpointRequest) -> pb.PartyMessage:
        """Make the sidecar's log durable up to this step, write this party's state, ack."""
        if self.run_dir is None:
            raise PartyError("the label party asked for a checkpoint, but this party has no "
                             "run directory to write it to")
        recorded = await self.tap.sync(request.step) if self.tap is not None else 0
        position = Position(request.step, request.batches)
        name = checkpoint_party_file(self.bottom.party_id)
        path = step_dir(self.run_dir.root, position) / name
        state = {"bottom": self.bottom.state_dict(), "rng": rng_state(), "step": request.step,
                 "data": {key: file.model_dump() for key, file in self.data.items()}}
        sha256 = save_state(path, state)
        prune_own(self.run_dir.root, name)
        return pb.PartyMessage(checkpoint=pb.CheckpointAck(step=request.step, sha256=sha256,
                                                           recorded=recorded))


# What gRPC reports of a write that failed because the label party ended the call meanwhile:
# a stand-in status that replaces the label party's own (received just before).
_WRITE_CUT_OFF = "Internal error from Core"


def _settled(step: Coroutine[Any, Any, T]) -> T | None:
    """The value of a coroutine that returns without waiting (a finished call's code or
    details), taken synchronously; None if it would wait."""
    try:
        step.send(None)
    except StopIteration as done:
        return done.value
    step.close()
    return None


class EndStatus:
    """The status the label party ended a Train call with, kept as it arrives: a write in
    flight then fails, and gRPC replaces that status with its stand-in (_WRITE_CUT_OFF)."""

    def __init__(self, call: Any) -> None:
        self.said: str | None = None
        call.add_done_callback(self._arrived)

    def _arrived(self, call: Any) -> None:
        code, details = _settled(call.code()), _settled(call.details())
        if code is not None and details is not None:
            self.said = f"{code.name}: {details}"


async def _write(call: Any, message: pb.PartyMessage, ended: EndStatus) -> None:
    """Write, or say why the label party ended the call meanwhile (its real status)."""
    try:
        await call.write(message)
        return
    except asyncio.InvalidStateError:
        pass
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.INTERNAL or err.details() != _WRITE_CUT_OFF:
            raise
    said = ended.said or f"{(await call.code()).name}: {await call.details()}"
    raise PartyError(f"the label party ended the stream with {said}")


async def _report(call: Any, component: str, message: str) -> None:
    """Tell the label party which component stopped this party, then end the call."""
    try:
        await call.write(pb.PartyMessage(failure=pb.PartyFailure(component=component,
                                                                 message=message[:2000])))
        await call.done_writing()
        await asyncio.wait_for(call.code(), 5.0)
    except (asyncio.InvalidStateError, grpc.aio.AioRpcError, TimeoutError):
        pass
    call.cancel()


def _decode_gradient(message: pb.LabelPartyMessage, bottom: BottomTrainer,
                     wire: torch.dtype) -> torch.Tensor:
    shape = bottom.pending_shape
    if shape is None:
        raise PartyError(f"received a cut gradient for step {message.gradient_step} but no "
                         "train activation is waiting for one")
    try:
        return decode_tensor(message.cut_gradient,
                             field=f"cut gradient (step {message.gradient_step})",
                             dtype=wire, shape=shape, finite=True).float()
    except CodecError as err:
        raise PartyError(str(err)) from None


def _decode_batch_ids(batch: pb.Batch, num_rows: int) -> np.ndarray:
    try:
        ids = decode_ids(batch.sample_ids, field=f"sample ids (step {batch.step})")
    except CodecError as err:
        raise PartyError(str(err)) from None
    if ids.size == 0 or ids.min() < 0 or ids.max() >= num_rows:
        raise PartyError(f"sample ids of step {batch.step} fall outside this party's "
                         f"{num_rows} rows")
    if batch.phase not in (pb.TRAIN, pb.EVAL):
        raise PartyError(f"batch of step {batch.step} has no valid phase ({batch.phase})")
    if batch.variant and (batch.phase != pb.EVAL or batch.variant not in VARIANTS):
        raise PartyError(f"batch of step {batch.step} asks for variant {batch.variant[:40]!r}; "
                         f"allowed on EVAL batches: {', '.join(VARIANTS)}")
    return ids


def _nobody_at(address: str, deadline_s: float, err: grpc.aio.AioRpcError) -> str:
    """No label party answered at `address` all the join deadline: say so, and what to check."""
    last = (err.details() or "").rsplit("last error: ", 1)[-1]
    return (f"no label party answered at {address} within topology.join_deadline_s = "
            f"{deadline_s:g} s ({last}); check --label-party and that `label-party serve` "
            "runs there and is reachable from this host")


# What gRPC says of a connection that broke (no status from the label party itself).
_CONNECTION_LOST = ("socket closed", "stream removed", "connection reset", "broken pipe",
                    "failed to connect")


def _describe(err: grpc.aio.AioRpcError, doing: str) -> str:
    details = err.details() or ""
    if (doing == "training" and err.code() == grpc.StatusCode.UNAVAILABLE
            and any(marker in details.lower() for marker in _CONNECTION_LOST)):
        return (f"lost the label party while training (UNAVAILABLE: {details}): it stopped or "
                "the network failed; once it serves again, continue the run with --resume on "
                "every host")
    return f"label party refused or failed while {doing}: {err.code().name}: {details}"
