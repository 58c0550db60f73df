"""The in-process reference: the same trainer, bottoms and step loop, with no network."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from attacker.sidecar.store import GradientStore
from label_party.driver import drive
from label_party.outputs import (
    clean_anchor_writer,
    snapshot_writer,
    write_labels,
    write_outputs,
)
from label_party.schedule import Batch, Phase, schedule
from label_party.setup import load_label_party_data, plan_record
from label_party.trainer import LabelPartyTrainer, NonFiniteStep
from orchestration.run import RunOutcome, collect_outcome
from passive_party.bottom_trainer import BottomTrainer
from passive_party.integrity import party_integrity
from passive_party.protection import protect_party, write_figures
from splitleak.artifacts.metrics import MetricsWriter
from splitleak.artifacts.outcome import write_outcome
from splitleak.artifacts.paths import RunDir
from splitleak.codec import as_received
from splitleak.config import ExperimentConfig
from splitleak.datasets import build_dataset
from splitleak.inputs import load_party_inputs
from splitleak.integrity import variant_rows
from splitleak.interrupts import interrupts_at_once
from splitleak.partition import passive_columns
from splitleak.placement import ATTACKER, LABEL, role_device, role_threads, roles
from splitleak.provenance import PluginError
from splitleak.stopping import stopped_by
from splitleak.timing import StepTimer, note
from splitleak.validation import resolved
from splitleak.watchdog import (
    STUCK_GRACE,
    Heartbeat,
    Stuck,
    end_stuck,
    stuck_sentence,
    suspects,
    watching,
)
from splitleak.white_box import SnapshotWriter, cafe_victim


class LocalExchange:
    """Calls each bottom directly, in party order, in the order the wire would deliver."""

    def __init__(self, bottoms: dict[int, BottomTrainer], store: GradientStore | None = None,
                 observe: set[int] | frozenset[int] = frozenset(),
                 record_activation: bool = False, wire_dtype: str = "float32",
                 received: GradientStore | None = None,
                 receive: set[int] | frozenset[int] = frozenset(),
                 threads: dict[str, int] | None = None) -> None:
        self.bottoms = bottoms
        # Each role's intra-op threads, as its own process would have them ("label", "1".."N").
        self.threads = threads or {}
        self.received = received  # the stand-in for the label party's tap ([threat.receiver])
        self.receive = receive
        self.wire_dtype = wire_dtype  # tensors are rounded as the wire would round them
        self.store = store  # the in-process stand-in for the tap + sidecar
        self.observe = observe
        self.record_activation = record_activation
        self._sent: dict[int, torch.Tensor] = {}  # each party's last train activation
        self.heartbeat = Heartbeat()  # the batch in hand: every role's step runs here

    def _backward(self, gradients: dict[int, torch.Tensor] | None, batch: Batch | None) -> None:
        if gradients is None or batch is None:
            return
        for k, bottom in self.bottoms.items():
            received = as_received(gradients[k], self.wire_dtype)
            self._as_role(str(k))
            bottom.backward(received)
            if self.store is not None and k in self.observe:
                tensors = {"cut_gradient": received.cpu().numpy()}
                if bottom.first_layer_gradient is not None:
                    tensors["first_layer_gradient"] = bottom.first_layer_gradient.cpu().numpy()
                if self.record_activation:  # as the tap: the activation this gradient answers
                    tensors["activation"] = self._sent[k].cpu().numpy()
                self.store.append(k, batch.epoch, batch.step, batch.sample_ids, tensors)

    async def exchange(self, gradients: dict[int, torch.Tensor] | None,
                       gradient_batch: Batch | None, next_batch: Batch,
                       meanwhile: Callable[[], object] | None = None) -> dict[int, torch.Tensor]:
        self.heartbeat.beat = next_batch
        if meanwhile is not None:  # the label party's own update, as it runs while parties compute
            meanwhile()
        self._backward(gradients, gradient_batch)
        train = next_batch.phase is Phase.TRAIN
        activations = {}
        for k, bottom in self.bottoms.items():
            self._as_role(str(k))
            activations[k] = as_received(bottom.forward(next_batch.sample_ids, train,
                                                        next_batch.epoch, next_batch.step,
                                                        next_batch.variant), self.wire_dtype)
        self._as_role(LABEL)
        if train:
            self._sent = activations
            if self.received is not None:
                for k in sorted(self.receive):
                    self.received.append(k, next_batch.epoch, next_batch.step, next_batch.sample_ids,
                                         {"activation": activations[k].cpu().numpy()})
        return activations

    async def finish(self, gradients: dict[int, torch.Tensor] | None,
                     gradient_batch: Batch | None) -> None:
        self._backward(gradients, gradient_batch)
        self._as_role(LABEL)
        self.heartbeat.beat = None

    def _as_role(self, role: str) -> None:
        if role in self.threads:
            torch.set_num_threads(self.threads[role])


def train_in_process(cfg: ExperimentConfig, run: RunDir,
                     on_record: Callable[[dict[str, Any]], None] | None = None,
                     watch: bool = False) -> RunOutcome:
    """`splitleak run --in-process`: the reference run, then summary.json as a distributed run
    leaves it. `watch`: a step stuck past its deadline ends this process, saying where
    (outcome.json, stderr)."""
    started = time.monotonic()

    def stuck(stuck: Stuck) -> None:
        batch = stuck.beat
        assert isinstance(batch, Batch)  # what LocalExchange beats
        limit = (f"{cfg.topology.passive_parties + 1} roles' topology.step_deadline_s = "
                 f"{cfg.topology.step_deadline_s:g} s each, plus {STUCK_GRACE:g} s grace")
        sentence = stuck_sentence("the in-process run", f"at {batch.phase.name} step {batch.step}",
                                  stuck, limit, "run it again (it writes no checkpoints)")
        write_outcome(run, {"status": "failed", "code": "DEADLINE_EXCEEDED", "message": sentence,
                            "seconds": time.monotonic() - started, "step": batch.step})
        print(f"run failed: {sentence}", file=sys.stderr, flush=True)  # as the CLI says a failure
        end_stuck(None, sentence, stuck.plugin)

    trained: list[int] = []  # the train steps done, for an interrupted run's outcome

    def seen(record: dict[str, Any]) -> None:
        if record.get("type") == "train":
            trained.append(record["step"])
        if on_record is not None:
            on_record(record)

    try:
        run_reference(cfg, run, seen, stuck if watch else None)
    except KeyboardInterrupt as err:  # Ctrl-C (SIGTERM: Terminated) between two steps
        step = trained[-1] + 1 if trained else 0
        write_outcome(run, {"status": "interrupted", "seconds": time.monotonic() - started,
                            "step": step, "message": f"stopped at step {step} ({stopped_by(err)}); "
                            "an in-process run writes no checkpoints: run it again"})
        raise
    except NonFiniteStep as err:  # the run diverged: outcome.json says so, as a distributed one's
        write_outcome(run, {"status": "failed", "code": "INVALID_ARGUMENT", "message": str(err),
                            "party": err.party_id, "seconds": time.monotonic() - started})
        raise
    except PluginError as err:  # an objective or defense broke, as the label party says it
        write_outcome(run, {"status": "failed", "code": "FAILED_PRECONDITION", "message": str(err),
                            "culprit": "label party", "seconds": time.monotonic() - started})
        raise
    return collect_outcome(run, "in-process", time.monotonic() - started)


def run_reference(cfg: ExperimentConfig, run: RunDir,
                  on_record: Callable[[dict[str, Any]], None] | None = None,
                  on_stuck: Callable[[Stuck], object] | None = None) -> dict[str, Any]:
    """Train the whole split model in this process; writes the same files as a distributed run.
    `on_record` sees each metrics record as it is written (a sweep's progress); `on_stuck` is
    told, from a watchdog thread, where a step is stuck once it has not moved for every role's
    step deadline (plus STUCK_GRACE)."""
    cfg = resolved(cfg)
    threads = {role: role_threads(cfg, role) for role in roles(cfg) if role != ATTACKER}
    torch.set_num_threads(threads[LABEL])
    label_device = role_device(cfg, LABEL)
    started = time.monotonic()
    dataset = build_dataset(cfg.dataset.name, cfg.dataset.params)
    data = load_label_party_data(cfg, dataset)
    write_labels(run, data, cfg)
    width = cfg.output_width(data.num_classes)
    observe = set(cfg.tapped_parties)
    capture = cfg.attacker.record_first_layer
    bottoms = {}
    for k, cols in passive_columns(cfg, data.schema).items():
        inputs = load_party_inputs(cfg, dataset, cols)
        bottoms[k] = BottomTrainer(cfg, k, inputs, width, capture and k in observe,
                                   party_integrity(cfg, k, dataset, inputs),
                                   role_device(cfg, str(k)))
    for k, bottom in bottoms.items():  # as each party does before it joins
        write_figures(run, k, protect_party(cfg, bottom))
        if cafe_victim(cfg, k):
            bottom.snapshots = SnapshotWriter(run.bottom_white_box(k), cfg.threat)
    store = GradientStore(run.gradients, run.root.name) if observe else None
    receive = set(cfg.received_parties)
    received = GradientStore(run.received, run.root.name) if receive else None
    anchors = clean_anchor_writer(run, cfg)
    trainer = LabelPartyTrainer(cfg, data.labels, data.num_classes,
                                {k: b.embedding_shape for k, b in bottoms.items()}, data.own_inputs,
                                data.train_ids, anchors, snapshot_writer(run, cfg), label_device)
    writer = MetricsWriter(run.metrics)

    def write(record: dict[str, Any]) -> None:
        writer.write(record)
        if on_record is not None:
            on_record(record)

    write(plan_record(data, len(bottoms), cfg.run.seed))
    batches = schedule(data.plan, data.train_ids, data.test_ids, cfg.run.seed,
                       variant_rows(cfg.threat, data.test_ids, cfg.run.seed))
    exchange = LocalExchange(bottoms, store, observe, cfg.attacker.record_activation, cfg.wire.dtype,
                             received, receive, threads)
    timer = StepTimer()
    limit = (cfg.topology.passive_parties + 1) * cfg.topology.step_deadline_s + STUCK_GRACE
    with (interrupts_at_once(),  # not at the end of the run: asyncio.run's Ctrl-C waits for that
          nullcontext() if on_stuck is None else
          watching(exchange.heartbeat, limit, on_stuck, lambda: suspects(trainer.plugins()))):
        asyncio.run(drive(trainer, batches, exchange, write, timer=timer))
    note(cuda_graphs={str(k): b.cuda_graphs for k, b in bottoms.items()})
    timer.write(run.label_timing, per="compute")
    writer.close()
    if anchors is not None:
        anchors.close()
    for each in (store, received):
        if each is not None:
            each.close()
    write_outputs(run, trainer)
    for k, bottom in bottoms.items():
        bottom.save(run.bottom_model(k))
    outcome = {"status": "ok", "seconds": time.monotonic() - started,
               "train_steps": data.plan.total_train_steps, "defenses": trainer.defense_summary(),
               "objective": trainer.objective_summary()}
    write_outcome(run, outcome)
    return outcome
