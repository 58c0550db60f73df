"""The label party's step: the objective's update, then each party's gradient through its defenses."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from label_party.defenses import DefenseChain, chain_summaries
from label_party.finite import all_finite
from label_party.objectives import ObjectiveSetup, build_objective, supervised_loss
from label_party.objectives.base import Own, blamed, check_logits, check_step_result
from label_party.schedule import Batch
from label_party.validate import class_gradients_error
from splitleak.anchors import CleanAnchorWriter
from splitleak.config import ConfigError, ExperimentConfig
from splitleak.inputs import PartyInputs
from splitleak.integrity import VARIANTS
from splitleak.placement import settle
from splitleak.provenance import own_plugin
from splitleak.white_box import SnapshotWriter

# An activation this large (or this many times the others') overflowing the loss is the
# sending party's fault; below it, the label party's own model diverged.
OVERFLOW_ACTIVATION = 1e6


class NonFiniteStep(ArithmeticError):
    """A train step whose loss or cut gradients are not finite; names the likely party."""

    def __init__(self, message: str, party_id: int | None) -> None:
        super().__init__(message)
        self.party_id = party_id


def non_finite_step(step: int, loss: float, activations: dict[int, torch.Tensor],
                    weights: dict[str, float] | None = None,
                    own_objective: str | None = None) -> NonFiniteStep:
    """Blame the party whose (finite) activation is by far the largest, if one is; else the
    label party's model, naming the objective's loss `weights` (field: value) that are set and
    `own_objective`, an objective of one's own (its plug-in origin), whose loss may be at fault."""
    peaks = {k: float(a.detach().abs().max()) if a.numel() else 0.0 for k, a in activations.items()}
    k = max(peaks, key=lambda party: peaks[party])
    others = max((v for party, v in peaks.items() if party != k), default=0.0)
    what = f"the loss of train step {step} is {loss}" if not math.isfinite(loss) else (
        f"the cut gradients of train step {step} are not finite")
    broken = sorted(party for party, peak in peaks.items() if not math.isfinite(peak))
    if broken:  # in process, where no codec refuses it on receipt
        return NonFiniteStep(f"{what}: passive party {broken[0]}'s activation is not finite "
                             "(NaN or Inf): its bottom model diverged", broken[0])
    if peaks[k] >= OVERFLOW_ACTIVATION and peaks[k] >= 100 * others:
        return NonFiniteStep(f"{what}: passive party {k}'s activation overflows it (max |h| = "
                             f"{peaks[k]:.3g}; the other parties' at most {others:.3g})", k)
    weighed = ", ".join(f"{field} = {value:g}" for field, value in (weights or {}).items() if value)
    hint = (f"; {weighed} weighs a term of its loss: a smaller weight may keep it finite"
            if weighed else "")
    if own_objective is not None:
        hint += (f"; the loss is {own_objective}'s, a plug-in of one's own: check that its "
                 "cut_gradients gives a finite loss and gradients for finite activations")
    return NonFiniteStep(f"{what}: the label party's model diverged (the parties' activations "
                         f"are at most {peaks[k]:.3g} in size){hint}", None)


class LabelPartyTrainer:
    """Owns the labels, the objective (top model and optimizer) and one defense chain per party."""

    def __init__(self, cfg: ExperimentConfig, labels: np.ndarray, num_classes: int,
                 activation_shapes: dict[int, tuple[int, ...]],
                 own_inputs: PartyInputs | None = None,
                 train_ids: np.ndarray | None = None,
                 anchors: CleanAnchorWriter | None = None,
                 snapshots: SnapshotWriter | None = None,
                 device: torch.device | str = "cpu", split_backward: bool = False) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.num_classes = num_classes
        self.party_ids = sorted(activation_shapes)
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64)).to(self.device)
        own_inputs = own_inputs.to(self.device) if own_inputs is not None else None
        self.own_inputs = own_inputs
        self.loss_kind = cfg.loss_for(num_classes)
        setup = ObjectiveSetup(
            cfg=cfg, labels=np.asarray(labels, dtype=np.int64),
            train_ids=np.arange(len(labels)) if train_ids is None else train_ids,
            num_classes=num_classes,
            activation_shapes=[activation_shapes[k] for k in self.party_ids],
            own_inputs=own_inputs, seed=cfg.run.seed, device=self.device)
        self.objective = build_objective(cfg.objective.name, cfg.objective.params, setup)
        # the backward pass to the objective's parameters after sending (Objective.split_backward)
        self.objective.split_backward = split_backward
        specs = [(spec.name, spec.params) for spec in cfg.defense]
        self.chains = {k: DefenseChain(specs, cfg.run.seed) for k in self.party_ids}
        # Per-class gradients cost K extra backward products: only when the chain reads them.
        self.class_gradients = any(c.needs_class_gradients for c in self.chains.values())
        if self.class_gradients and not self.objective.supports_class_gradients:
            raise ConfigError(class_gradients_error(cfg))
        self._eval: list[tuple[str, np.ndarray, torch.Tensor, torch.Tensor]] = []
        self.anchors = anchors  # evaluation-only: clean gradients of a few positives per batch
        self.snapshots = snapshots  # evaluation-only: the model a white-box attacker knows
        self._update_pending = False  # the last train step's own update is not applied yet

    def _batch(self, sample_ids: np.ndarray) -> tuple[torch.Tensor, Own]:
        """The batch's labels and own feature rows, the ids moved to this party's device once
        (index_select: the rows indexing gives, at a quarter of its time on the CPU)."""
        ids = self._ids(sample_ids)
        own = self.own_inputs.rows(ids) if self.own_inputs is not None else (None, None)
        return self.labels.index_select(0, ids), own

    def _ids(self, sample_ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(sample_ids).to(self.device, non_blocking=True)

    def update(self) -> None:
        """Apply the last train step's update of the label party's own parameters, if it is
        still pending. The driver runs it once that step's gradients are on their way (while
        the parties compute); everything that reads the parameters runs it first."""
        if self._update_pending:
            self._update_pending = False
            with blamed(type(self.objective), "update"):
                self.objective.update()

    def train_step(self, batch: Batch,
                   activations: dict[int, torch.Tensor]) -> tuple[dict[int, torch.Tensor], dict]:
        """Each party's (defended) cut gradient, on this party's device (activations may come
        from any); the objective's own update is left pending (see `update`)."""
        self.update()
        acts = [activations[k].to(self.device, non_blocking=True).detach().requires_grad_(True)
                for k in self.party_ids]
        y, own = self._batch(batch.sample_ids)
        if self.snapshots is not None:  # the parameters this step's gradient is computed with
            self.snapshots.record(batch.epoch, batch.step,
                                  self.objective.top)  # type: ignore[attr-defined]
        with blamed(type(self.objective), "cut_gradients"):
            result = self.objective.cut_gradients(acts, own, batch.sample_ids,
                                                  y, class_gradients=self.class_gradients)
        self._update_pending = True
        check_step_result(type(self.objective), result, acts)
        if not math.isfinite(result.loss) or not all(all_finite(g) for g in result.gradients):
            raise non_finite_step(batch.step, result.loss, activations,
                                  self.objective.loss_weights(), own_plugin(
                                      "objective", self.cfg.objective.name, type(self.objective)))
        per_class: Sequence[torch.Tensor | None] = result.class_gradients or [None] * len(self.party_ids)
        record: dict[str, Any] = {
            "type": "train", "epoch": batch.epoch, "step": batch.step, "loss": result.loss,
            "batch_size": len(y),
            "positives": int((y == 1).sum().item()) if self.num_classes == 2 else None,
            **result.metrics}
        gradients = {}
        for k, gradient, class_gradients in zip(self.party_ids, result.gradients, per_class,
                                                strict=True):
            if self.anchors is not None:
                self.anchors.record(k, batch.epoch, batch.step, batch.sample_ids, y.cpu().numpy(),
                                    gradient.detach().cpu().numpy())
            gradients[k], diagnostics = self.chains[k].apply(
                gradient, y, party_id=k, epoch=batch.epoch, step=batch.step,
                num_classes=self.num_classes, class_gradients=class_gradients)
            if diagnostics:
                record[f"defense.{k}"] = diagnostics
        settle(self.device)
        return gradients, record

    @torch.no_grad()
    def eval_step(self, batch: Batch, activations: dict[int, torch.Tensor]) -> dict | None:
        """Accumulate predictions; at the pass's last batch return the metrics of each split it
        scored (`test_*`, and `train_*` when the pass covered the train rows)."""
        self.update()
        y, own = self._batch(batch.sample_ids)
        with blamed(type(self.objective), "predict"):
            logits = self.objective.predict([activations[k].to(self.device)
                                             for k in self.party_ids], own)
        check_logits(type(self.objective), logits, len(y), self.cfg.output_width(self.num_classes))
        self._eval.append((batch.split, batch.sample_ids, logits.float().cpu(), y.cpu()))
        if not batch.last_of_eval:
            return None
        record: dict[str, Any] = {"type": "eval", "epoch": batch.epoch, "step": batch.step}
        for split in dict.fromkeys(split for split, _, _, _ in self._eval):
            record.update(self._split_metrics(split, [(lg, y) for s, _, lg, y in self._eval
                                                      if s == split]))
            if split in VARIANTS:
                record.update(self._variant_metrics(split))
        self._eval.clear()
        return record

    def _predicted(self, logits: torch.Tensor) -> torch.Tensor:
        return (logits[:, 0] > 0).long() if self.loss_kind == "bce" else logits.argmax(1)

    def _variant_metrics(self, split: str) -> dict[str, Any]:
        """An integrity attack's rows (evaluation only): the confusion matrix of their labels
        (rows) against the predictions (columns), and the accuracy the same rows got clean in
        this pass's test split."""
        ids = np.concatenate([i for s, i, _, _ in self._eval if s == split])
        y = torch.cat([t for s, _, _, t in self._eval if s == split])
        pred = torch.cat([self._predicted(lg) for s, _, lg, _ in self._eval if s == split])
        confusion = np.zeros((self.num_classes, self.num_classes), dtype=np.int64)
        np.add.at(confusion, (y.numpy(), pred.numpy()), 1)
        record: dict[str, Any] = {f"{split}_confusion": confusion.tolist()}
        clean = [(i, self._predicted(lg), t) for s, i, lg, t in self._eval if s == "test"]
        if clean:
            test_ids = np.concatenate([i for i, _, _ in clean])
            right = torch.cat([p == t for _, p, t in clean]).numpy()
            found = np.isin(test_ids, ids)
            record[f"{split}_clean_accuracy"] = float(right[found].mean()) if found.any() else None
        return record

    def _split_metrics(self, split: str, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
        logits = torch.cat([lg for lg, _ in parts])
        y = torch.cat([t for _, t in parts])
        record: dict[str, Any] = {f"{split}_loss": float(supervised_loss(logits, y, self.loss_kind)),
                                  f"{split}_rows": len(y)}
        pred = self._predicted(logits)
        if self.num_classes == 2:
            scores = logits[:, 0] if self.loss_kind == "bce" else logits[:, 1] - logits[:, 0]
            both = len(torch.unique(y)) == 2
            from sklearn.metrics import roc_auc_score  # at the first evaluation, not at start

            record[f"{split}_auc"] = float(roc_auc_score(y.numpy(), scores.numpy())) if both else None
        record[f"{split}_accuracy"] = float((pred == y).double().mean())
        return record

    def plugins(self) -> list[tuple[str, str, Any]]:
        """(kind, name, class) of the objective and of each defense: what a step runs."""
        chain = next(iter(self.chains.values()), None)
        return [("objective", self.cfg.objective.name, type(self.objective)),
                *(("defense", cls.name, cls) for cls in (chain.classes if chain else []))]

    def defense_summary(self) -> dict[int, Any]:
        return chain_summaries(self.chains)

    def objective_summary(self) -> dict[str, Any]:
        self.update()
        with blamed(type(self.objective), "summary"):
            return {"name": self.objective.name, **self.objective.summary()}

    def model_state(self) -> dict[str, Any]:
        """What top.pt holds: the objective's models and optimizers."""
        self.update()
        with blamed(type(self.objective), "state_dict"):
            return self.objective.state_dict()

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint needs: the objective and each party's defense chain."""
        self.update()
        with blamed(type(self.objective), "state_dict"):
            objective = self.objective.state_dict()
        return {"objective": objective,
                "defenses": {str(k): chain.state_dict() for k, chain in self.chains.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._update_pending = False  # the state replaces whatever was pending
        with blamed(type(self.objective), "load_state_dict"):
            self.objective.load_state_dict(state["objective"])
        for k, chain in self.chains.items():
            chain.load_state_dict(state["defenses"][str(k)])
