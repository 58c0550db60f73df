"""EXACT (Qiu et al.): white-box exhaustive reconstruction of the label party's private
categorical features and labels from the cut gradient, nearest candidate in L2 (ALGORITHMS.md §2.10).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from pydantic import Field, PositiveInt
from sklearn.metrics import f1_score

from attacker.attacks.base import (
    ATTACKS,
    AttackParams,
    AttackRefused,
    RunAttack,
    RunContext,
    RunResult,
)
from attacker.store import GradientLog
from splitleak.datasets import build_dataset
from splitleak.models import build_top, input_spec
from splitleak.partition import label_party_columns
from splitleak.white_box import FEATURE_PREFIX, OwnColumns, own_columns, read_snapshot, snapshot_files


class ExactParams(AttackParams):
    # Refuse above this many (private values x labels) candidates per example.
    max_combinations: PositiveInt = Field(100_000, le=10**9)
    # Candidate gradients computed per torch call (memory: this x d x 4 bytes, a few times).
    chunk_candidates: PositiveInt = Field(1 << 18, le=1 << 26)


@dataclass(frozen=True)
class Candidates:
    """Every combination of the private features' values: [F, P] codes."""

    codes: torch.Tensor
    columns: tuple[int, ...]  # positions of the private features among the own categoricals
    labels: int  # label values enumerated (2 for a binary task)

    @classmethod
    def enumerate(cls, cardinalities: list[int], columns: tuple[int, ...], labels: int) -> Candidates:
        grids = torch.meshgrid(*[torch.arange(c) for c in cardinalities], indexing="ij")
        return cls(torch.stack([g.reshape(-1) for g in grids], dim=1), columns, labels)

    @property
    def count(self) -> int:
        return int(self.codes.shape[0]) * self.labels


def logit_cotangents(logits: torch.Tensor, labels: int, batch_size: int) -> torch.Tensor:
    """[L, N, outputs]: d(mean loss over the batch)/d(logits) of each row if its label were c, for
    each c: BCE on one logit (sigma(z) - c) or softmax cross-entropy (softmax(z) - onehot(c)),
    divided by the batch size as the label party's mean loss is."""
    if logits.shape[1] == 1:
        c = torch.arange(labels, dtype=logits.dtype)[:, None, None]
        return (torch.sigmoid(logits)[None] - c) / batch_size
    onehot = torch.eye(logits.shape[1], dtype=logits.dtype)[:labels, None, :]
    return (torch.softmax(logits, dim=1)[None] - onehot) / batch_size


def candidate_gradients(top: torch.nn.Module, activations: torch.Tensor, numeric: torch.Tensor,
                        categorical: torch.Tensor, candidates: Candidates,
                        batch_size: int) -> torch.Tensor:
    """[n, L, F, d]: the cut gradient the label party would return for each of n examples under
    each (label, private values) candidate; one forward and L backward passes for all of them."""
    n, f = activations.shape[0], candidates.codes.shape[0]
    h = activations.repeat_interleave(f, dim=0).detach().requires_grad_(True)
    cats = categorical.repeat_interleave(f, dim=0).clone()
    cats[:, list(candidates.columns)] = candidates.codes.repeat(n, 1)
    logits = top([h], numeric.repeat_interleave(f, dim=0), cats)
    cotangents = logit_cotangents(logits.detach(), candidates.labels, batch_size)
    grads = torch.autograd.grad(logits, h, grad_outputs=cotangents, is_grads_batched=True)[0]
    return grads.reshape(candidates.labels, n, f, -1).transpose(0, 1)


def reconstruct(top: torch.nn.Module, activations: torch.Tensor, gradients: torch.Tensor,
                numeric: torch.Tensor, categorical: torch.Tensor, candidates: Candidates,
                chunk_candidates: int = 1 << 18) -> tuple[np.ndarray, np.ndarray]:
    """(labels [B], private codes [B, P]) of one received batch: per example the candidate whose
    gradient is nearest in L2 to the received one (the whole batch: its size scales the loss)."""
    batch_size = activations.shape[0]
    flat = gradients.reshape(batch_size, -1)
    per_chunk = max(1, chunk_candidates // candidates.count)
    labels, codes = [], []
    for start in range(0, batch_size, per_chunk):
        rows = slice(start, start + per_chunk)
        cand = candidate_gradients(top, activations[rows], numeric[rows], categorical[rows],
                                   candidates, batch_size)
        distance = (cand - flat[rows, None, None, :]).square().sum(-1).reshape(cand.shape[0], -1)
        best = distance.argmin(dim=1)
        f = candidates.codes.shape[0]
        labels.append((best // f).numpy())
        codes.append(candidates.codes[best % f].numpy())
    return np.concatenate(labels), np.concatenate(codes)


@ATTACKS.register("exact")
class ExactAttack(RunAttack):
    name = "exact"
    family = "label_inference"
    side_knowledge = ("white box: the label party's top model and own bottom at each snapshot "
                      "step, the activation it sent, the label party's non-private columns")
    Params = ExactParams
    params: ExactParams

    def run(self, context: RunContext) -> RunResult:
        cfg, run = context.cfg, context.run
        if len(context.parties) != 1 or context.parties[0] not in cfg.threat.white_box_parties:
            raise ValueError(f"parties {list(context.parties)}: EXACT runs for one party declared "
                             "white_box = true in [threat.parties.K]")
        party = context.parties[0]
        schema = build_dataset(cfg.dataset.name, cfg.dataset.params).schema()
        own = own_columns(cfg, schema)
        own_spec = input_spec(schema, label_party_columns(cfg, schema) or (0, 0))  # own_columns: set
        candidates = Candidates.enumerate(own.private_cardinalities, own.private, context.num_classes)
        self.check_size(own, candidates)
        snapshots = snapshot_files(run.white_box)
        if not snapshots:
            raise ValueError(f"no white-box snapshot in {run.white_box} (the label party writes "
                             "them when the threat model declares a white-box party)")
        numeric_by_id, categorical_by_id = _own_features(run.labels, own)
        top: torch.nn.Module | None = None
        truth_labels, truth_codes, labels, codes = [], [], [], []
        for batch in GradientLog(run.attacker / "gradients").batches(party):
            if batch.step not in snapshots or "activation" not in batch.tensors:
                continue
            step, state = read_snapshot(snapshots[batch.step])
            activations = torch.from_numpy(np.array(batch.tensors["activation"]))
            if top is None:
                top = build_top(cfg.model, [tuple(activations.shape[1:])], own_spec,
                                cfg.output_width(context.num_classes), seed=0)
            top.load_state_dict(state)
            ids = torch.from_numpy(np.array(batch.sample_ids))
            with torch.enable_grad():
                found_labels, found_codes = reconstruct(
                    top, activations, torch.from_numpy(np.array(batch.tensors["cut_gradient"])),
                    numeric_by_id[ids], categorical_by_id[ids], candidates,
                    self.params.chunk_candidates)
            labels.append(found_labels)
            codes.append(found_codes)
            truth_labels.append(context.truth(batch.sample_ids))
            truth_codes.append(categorical_by_id[ids][:, list(own.private)].numpy())
        if not labels:
            raise ValueError("no recorded batch at a snapshot step has both the cut gradient and "
                             "the activation (attacker.record_activation)")
        return _scores(own, candidates, np.concatenate(labels), np.concatenate(codes),
                       np.concatenate(truth_labels), np.concatenate(truth_codes), len(labels))

    def check_size(self, own: OwnColumns, candidates: Candidates) -> None:
        """Refuse an enumeration above the cap, naming its factors."""
        if candidates.count > self.params.max_combinations:
            factors = " x ".join(f"{c} ({n})" for c, n in zip(own.private_cardinalities,
                                                             own.private_names, strict=True))
            raise AttackRefused(
                f"exact: {factors} x {candidates.labels} labels = {candidates.count:,} candidate "
                f"gradients per example exceeds max_combinations = {self.params.max_combinations:,}; "
                "name fewer threat.white_box.private_features or raise the cap "
                "(--attacks 'exact:max_combinations=N')")


def _own_features(labels_path: Any, own: OwnColumns) -> tuple[torch.Tensor, torch.Tensor]:
    """The label party's own columns by sample id, from the evaluation-only label export."""
    wanted = [FEATURE_PREFIX + n for n in own.numeric + own.categorical]
    names = pq.read_schema(labels_path).names
    missing = [n for n in wanted if n not in names]
    if missing:
        raise ValueError(f"{labels_path} lacks {missing}: the label party exports its own feature "
                         "values only when the threat model declares a white-box party")
    table = pq.read_table(labels_path, columns=["sample_id", *wanted])
    ids = table.column("sample_id").to_numpy()
    size = int(ids.max()) + 1
    numeric = np.zeros((size, len(own.numeric)), dtype=np.float32)
    categorical = np.zeros((size, len(own.categorical)), dtype=np.int64)
    for i, name in enumerate(own.numeric):
        numeric[ids, i] = table.column(FEATURE_PREFIX + name).to_numpy()
    for i, name in enumerate(own.categorical):
        categorical[ids, i] = table.column(FEATURE_PREFIX + name).to_numpy()
    return torch.from_numpy(numeric), torch.from_numpy(categorical)


def _scores(own: OwnColumns, candidates: Candidates, labels: np.ndarray, codes: np.ndarray,
            truth_labels: np.ndarray, truth_codes: np.ndarray, batches: int) -> RunResult:
    """Label F1 (positive class; macro over classes when multi-class) and per-feature macro-F1."""
    average = "binary" if candidates.labels == 2 else "macro"
    label_f1 = float(f1_score(truth_labels, labels, average=average, zero_division=0))
    # Macro over the values present in the truth: a value no row holds has no F1 to average.
    features = {name: float(f1_score(truth_codes[:, j], codes[:, j], labels=np.unique(truth_codes[:, j]),
                                     average="macro", zero_division=0))
                for j, name in enumerate(own.private_names)}
    correct = int((labels == truth_labels).sum())
    figures = {"label_f1": label_f1, "feature_f1": features,
               "feature_accuracy": {name: float((codes[:, j] == truth_codes[:, j]).mean())
                                    for j, name in enumerate(own.private_names)},
               "candidates_per_example": candidates.count, "batches": batches,
               "combinations": math.prod(own.private_cardinalities)}
    return RunResult(correct / labels.size, correct, int(labels.size), figures)
