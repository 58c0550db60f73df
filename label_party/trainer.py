"""The label party's math for one step: top model, loss, cut gradients through the defenses."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch.nn import functional as F

from label_party.defenses import DefenseChain
from label_party.schedule import Batch
from splitleak.config import ExperimentConfig
from splitleak.inputs import PartyInputs
from splitleak.models import build_top
from splitleak.optim import make_optimizer
from splitleak.seeding import derive_seed


class LabelPartyTrainer:
    """Owns the labels, the top model (with the label party's own part) and its optimizer."""

    def __init__(self, cfg: ExperimentConfig, labels: np.ndarray, num_classes: int,
                 activation_shapes: dict[int, tuple[int, ...]],
                 own_inputs: PartyInputs | None = None) -> None:
        self.cfg = cfg
        self.num_classes = num_classes
        self.party_ids = sorted(activation_shapes)
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64))
        self.own_inputs = own_inputs
        self.loss_kind = cfg.loss_for(num_classes)
        self.top = build_top(cfg.model, [activation_shapes[k] for k in self.party_ids],
                             own_inputs.spec if own_inputs else None, cfg.output_width(num_classes),
                             derive_seed(cfg.run.seed, "top"))
        self.optimizer = make_optimizer(self.top.parameters(), cfg.optimizer_for("label"))
        specs = [(spec.name, spec.params) for spec in cfg.defense]
        self.chains = {k: DefenseChain(specs, cfg.run.seed) for k in self.party_ids}
        self._eval: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _logits(self, sample_ids: np.ndarray, activations: list[torch.Tensor]) -> torch.Tensor:
        own = (None, None)
        if self.own_inputs is not None:
            own = self.own_inputs.rows(torch.from_numpy(sample_ids))
        return self.top(activations, *own)

    def _loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.loss_kind == "bce":
            return F.binary_cross_entropy_with_logits(logits[:, 0], y.to(logits.dtype))
        return F.cross_entropy(logits, y)

    def train_step(self, batch: Batch,
                   activations: dict[int, torch.Tensor]) -> tuple[dict[int, torch.Tensor], dict]:
        """Forward, loss, backward, top update; returns each party's (defended) cut gradient."""
        acts = [activations[k].detach().requires_grad_(True) for k in self.party_ids]
        y = self.labels[torch.from_numpy(batch.sample_ids)]
        self.top.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._loss(self._logits(batch.sample_ids, acts), y)
        loss.backward()
        self.optimizer.step()
        record: dict[str, Any] = {"type": "train", "epoch": batch.epoch, "step": batch.step,
                                  "loss": float(loss.detach()), "batch_size": len(y),
                                  "positives": int((y == 1).sum()) if self.num_classes == 2 else None}
        gradients = {}
        for k, act in zip(self.party_ids, acts, strict=True):
            assert act.grad is not None
            gradients[k], diagnostics = self.chains[k].apply(
                act.grad, y, party_id=k, epoch=batch.epoch, step=batch.step,
                num_classes=self.num_classes)
            if diagnostics:
                record[f"defense.{k}"] = diagnostics
        return gradients, record

    @torch.no_grad()
    def eval_step(self, batch: Batch, activations: dict[int, torch.Tensor]) -> dict | None:
        """Accumulate test predictions; at the pass's last batch return the test metrics."""
        self.top.eval()
        logits = self._logits(batch.sample_ids, [activations[k] for k in self.party_ids])
        self._eval.append((logits, self.labels[torch.from_numpy(batch.sample_ids)]))
        if not batch.last_of_eval:
            return None
        logits = torch.cat([lg for lg, _ in self._eval])
        y = torch.cat([t for _, t in self._eval])
        self._eval.clear()
        record: dict[str, Any] = {"type": "eval", "epoch": batch.epoch, "step": batch.step,
                                  "test_loss": float(self._loss(logits, y)), "test_rows": len(y)}
        pred = (logits[:, 0] > 0).long() if self.loss_kind == "bce" else logits.argmax(1)
        if self.num_classes == 2:
            scores = logits[:, 0] if self.loss_kind == "bce" else logits[:, 1] - logits[:, 0]
            both = len(torch.unique(y)) == 2
            record["test_auc"] = float(roc_auc_score(y.numpy(), scores.numpy())) if both else None
        record["test_accuracy"] = float((pred == y).double().mean())
        return record

    def defense_summary(self) -> dict[int, Any]:
        return {k: chain.summary() for k, chain in self.chains.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"top": self.top.state_dict(), "optimizer": self.optimizer.state_dict()}

