"""The label party's step: the objective's update, then each party's gradient through its defenses."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from label_party.defenses import DefenseChain
from label_party.objectives import ObjectiveSetup, build_objective, supervised_loss
from label_party.schedule import Batch
from splitleak.config import ExperimentConfig
from splitleak.inputs import PartyInputs


class LabelPartyTrainer:
    """Owns the labels, the objective (top model and optimizer) and one defense chain per party."""

    def __init__(self, cfg: ExperimentConfig, labels: np.ndarray, num_classes: int,
                 activation_shapes: dict[int, tuple[int, ...]],
                 own_inputs: PartyInputs | None = None,
                 train_ids: np.ndarray | None = None) -> None:
        self.cfg = cfg
        self.num_classes = num_classes
        self.party_ids = sorted(activation_shapes)
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64))
        self.own_inputs = own_inputs
        self.loss_kind = cfg.loss_for(num_classes)
        setup = ObjectiveSetup(
            cfg=cfg, labels=np.asarray(labels, dtype=np.int64),
            train_ids=np.arange(len(labels)) if train_ids is None else train_ids,
            num_classes=num_classes,
            activation_shapes=[activation_shapes[k] for k in self.party_ids],
            own_inputs=own_inputs, seed=cfg.run.seed)
        self.objective = build_objective(cfg.objective.name, cfg.objective.params, setup)
        specs = [(spec.name, spec.params) for spec in cfg.defense]
        self.chains = {k: DefenseChain(specs, cfg.run.seed) for k in self.party_ids}
        self._eval: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def _own(self, sample_ids: np.ndarray) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.own_inputs is None:
            return None, None
        return self.own_inputs.rows(torch.from_numpy(sample_ids))

    def train_step(self, batch: Batch,
                   activations: dict[int, torch.Tensor]) -> tuple[dict[int, torch.Tensor], dict]:
        """The objective's update; returns each party's (defended) cut gradient."""
        acts = [activations[k].detach().requires_grad_(True) for k in self.party_ids]
        y = self.labels[torch.from_numpy(batch.sample_ids)]
        result = self.objective.train_step(acts, self._own(batch.sample_ids), batch.sample_ids, y)
        record: dict[str, Any] = {
            "type": "train", "epoch": batch.epoch, "step": batch.step, "loss": result.loss,
            "batch_size": len(y),
            "positives": int((y == 1).sum()) if self.num_classes == 2 else None,
            **result.metrics}
        gradients = {}
        for k, gradient in zip(self.party_ids, result.gradients, strict=True):
            gradients[k], diagnostics = self.chains[k].apply(
                gradient, y, party_id=k, epoch=batch.epoch, step=batch.step,
                num_classes=self.num_classes)
            if diagnostics:
                record[f"defense.{k}"] = diagnostics
        return gradients, record

    @torch.no_grad()
    def eval_step(self, batch: Batch, activations: dict[int, torch.Tensor]) -> dict | None:
        """Accumulate predictions; at the pass's last batch return the metrics of each split it
        scored (`test_*`, and `train_*` when the pass covered the train rows)."""
        logits = self.objective.predict([activations[k] for k in self.party_ids],
                                        self._own(batch.sample_ids))
        self._eval.append((batch.split, logits, self.labels[torch.from_numpy(batch.sample_ids)]))
        if not batch.last_of_eval:
            return None
        record: dict[str, Any] = {"type": "eval", "epoch": batch.epoch, "step": batch.step}
        for split in dict.fromkeys(split for split, _, _ in self._eval):
            record.update(self._split_metrics(split, [(lg, y) for s, lg, y in self._eval
                                                      if s == split]))
        self._eval.clear()
        return record

    def _split_metrics(self, split: str, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
        logits = torch.cat([lg for lg, _ in parts])
        y = torch.cat([t for _, t in parts])
        record: dict[str, Any] = {f"{split}_loss": float(supervised_loss(logits, y, self.loss_kind)),
                                  f"{split}_rows": len(y)}
        pred = (logits[:, 0] > 0).long() if self.loss_kind == "bce" else logits.argmax(1)
        if self.num_classes == 2:
            scores = logits[:, 0] if self.loss_kind == "bce" else logits[:, 1] - logits[:, 0]
            both = len(torch.unique(y)) == 2
            record[f"{split}_auc"] = float(roc_auc_score(y.numpy(), scores.numpy())) if both else None
        record[f"{split}_accuracy"] = float((pred == y).double().mean())
        return record

    def defense_summary(self) -> dict[int, Any]:
        return {k: chain.summary() for k, chain in self.chains.items()}

    def objective_summary(self) -> dict[str, Any]:
        return {"name": self.objective.name, **self.objective.summary()}

    def state_dict(self) -> dict[str, Any]:
        return self.objective.state_dict()
