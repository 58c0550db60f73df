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

from attacker.attacks.base import (
    ATTACKS,
    AttackParams,
    AttackRefused,
    RunAttack,
    RunContext,
    RunResult,
)
from attacker.sidecar.store import GradientLog
from splitleak.config import ConfigError, ExperimentConfig
from splitleak.datasets import build_dataset
from splitleak.models import build_top, input_spec
from splitleak.partition import label_party_columns
from splitleak.seeding import rng
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


@dataclass(frozen=True)
class Reconstruction:
    """One batch's answer: per example the nearest candidate's label and private codes, and for
    each example with an exact tie (several candidates at the same, minimal distance) the
    labels [T] and codes [T, P] of its tied candidates."""

    labels: np.ndarray  # [B]
    codes: np.ndarray  # [B, P]
    ties: dict[int, tuple[np.ndarray, np.ndarray]]  # row -> (labels, codes) of the tied candidates


def reconstruct(top: torch.nn.Module, activations: torch.Tensor, gradients: torch.Tensor,
                numeric: torch.Tensor, categorical: torch.Tensor, candidates: Candidates,
                chunk_candidates: int = 1 << 18,
                generator: np.random.Generator | None = None) -> Reconstruction:
    """Per example of one received batch, the candidate whose gradient is nearest in L2 to the
    received one (the whole batch: its size scales the loss). Tie rule: candidates whose squared
    distance equals the minimum exactly (float32) are tied, and one of them is drawn uniformly
    with `generator` (seeded; default seed 0), never taken by enumeration order."""
    generator = generator if generator is not None else np.random.default_rng(0)
    batch_size = activations.shape[0]
    flat = gradients.reshape(batch_size, -1)
    per_chunk = max(1, chunk_candidates // candidates.count)
    f = candidates.codes.shape[0]
    best_all, ties = [], {}
    for start in range(0, batch_size, per_chunk):
        rows = slice(start, start + per_chunk)
        cand = candidate_gradients(top, activations[rows], numeric[rows], categorical[rows],
                                   candidates, batch_size)
        distance = (cand - flat[rows, None, None, :]).square().sum(-1).reshape(cand.shape[0], -1)
        best = distance.argmin(dim=1).numpy()
        at_minimum = (distance == distance.min(dim=1, keepdim=True).values).numpy()
        for row in np.flatnonzero(at_minimum.sum(axis=1) > 1):  # rare: a Python loop is fine
            tied = np.flatnonzero(at_minimum[row])
            best[row] = generator.choice(tied)
            ties[start + int(row)] = (tied // f, candidates.codes[tied % f].numpy())
        best_all.append(best)
    best = np.concatenate(best_all)
    return Reconstruction(best // f, candidates.codes[best % f].numpy(), ties)


@ATTACKS.register("exact")
class ExactAttack(RunAttack):
    name = "exact"
    family = "label_inference"
    side_knowledge = ("white box: the label party's top model and own bottom at each snapshot "
                      "step, the activation it sent, the label party's non-private columns")
    Params = ExactParams
    params: ExactParams

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        """Qiu et al.'s set-up (ALGORITHMS.md §2.10), wherever a party is white-box: two parties,
        the plain objective, a label party with its own (private) features, and the activations
        the attacker sent on record."""
        if not cfg.threat.white_box_parties:
            return
        needs = [
            (cfg.topology.passive_parties == 1, "topology.passive_parties = 1 (Qiu et al.'s two-"
             "party split: with more, the gradient also depends on activations the attacker "
             "never sees)"),
            (cfg.features.label_party is not None, "features.label_party = [start, stop) (the "
             "private features EXACT reconstructs live there)"),
            (cfg.objective.name == "cross_entropy", f"objective = 'cross_entropy' (got "
             f"'{cfg.objective.name}'; defend with the gradient chain, e.g. dp_gaussian)"),
            (cfg.model.kind != "cnn", "model.kind = 'mlp' or 'wide_deep' (categorical private "
             "features)"),
            (cfg.attacker.enabled and cfg.attacker.record_activation,
             "attacker.enabled = true and attacker.record_activation = true (EXACT needs the "
             "activation the party sent next to the gradient it received)"),
        ]
        missing = [what for ok, what in needs if not ok]
        if missing:
            raise ConfigError(f"threat.parties.{cfg.threat.white_box_parties[0]}.white_box = true "
                              "(EXACT) needs " + "; ".join(missing))
        # The enumeration's size is known now: refused here, not after training.
        listed = next((spec.params for spec in cfg.attacker.attacks if spec.name == cls.name), {})
        try:
            attack = cls(cls.Params.model_validate(listed))
            schema = build_dataset(cfg.dataset.name, cfg.dataset.params).layout()
            own = own_columns(cfg, schema)
            attack.check_size(own, Candidates.enumerate(own.private_cardinalities, own.private,
                                                        schema.num_classes))
        except AttackRefused as err:
            raise ConfigError(str(err)) from None

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
        truth_labels, truth_codes, found = [], [], []
        for batch in GradientLog(run.gradients).batches(party):
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
                found.append(reconstruct(
                    top, activations, torch.from_numpy(np.array(batch.tensors["cut_gradient"])),
                    numeric_by_id[ids], categorical_by_id[ids], candidates,
                    self.params.chunk_candidates, rng(context.seed, "exact", "ties", batch.step)))
            truth_labels.append(context.truth(batch.sample_ids))
            truth_codes.append(categorical_by_id[ids][:, list(own.private)].numpy())
        if not found:
            raise ValueError("no recorded batch at a snapshot step has both the cut gradient and "
                             "the activation (attacker.record_activation)")
        return _scores(own, candidates, found, np.concatenate(truth_labels),
                       np.concatenate(truth_codes))

    def check_size(self, own: OwnColumns, candidates: Candidates) -> None:
        """Refuse an enumeration above the cap, naming its factors."""
        if candidates.count > self.params.max_combinations:
            factors = " x ".join(f"{c} ({n})" for c, n in zip(own.private_cardinalities,
                                                             own.private_names, strict=True))
            raise AttackRefused(
                f"exact: {factors} x {candidates.labels} labels = {candidates.count:,} candidate "
                f"gradients per example exceeds max_combinations = {self.params.max_combinations:,}; "
                "name fewer threat.white_box.private_features or raise the cap (attacker.attacks = "
                "[{ name = \"exact\", max_combinations = N }], or --attacks "
                "'exact:max_combinations=N' to attacker analyze)")


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


def _f1s(own: OwnColumns, two_labels: bool, truth: np.ndarray, answer: np.ndarray) -> tuple[
        float, dict[str, float]]:
    """Label F1 (positive class; macro over classes when multi-class) and per-feature macro-F1
    of `answer` = [B, 1 + P] (label, private codes) against `truth`."""
    average = "binary" if two_labels else "macro"
    from sklearn.metrics import f1_score  # when the attack runs, not at start

    label_f1 = float(f1_score(truth[:, 0], answer[:, 0], average=average, zero_division=0))
    # Macro over the values present in the truth: a value no row holds has no F1 to average.
    features = {name: float(f1_score(truth[:, j + 1], answer[:, j + 1], labels=np.unique(truth[:, j + 1]),
                                     average="macro", zero_division=0))
                for j, name in enumerate(own.private_names)}
    return label_f1, features


def settle_ties(answer: np.ndarray, truth: np.ndarray, ties: dict[int, np.ndarray],
                right: bool) -> np.ndarray:
    """`answer` [B, 1 + P] with every tied row's items settled against the truth: `right` takes
    the true value wherever a tied candidate has it, else (wrong) a tied value that is not the
    truth wherever one exists (the first, in enumeration order); an item every tied candidate
    agrees on keeps that value."""
    settled = answer.copy()
    for row, tied in ties.items():  # tied: [T, 1 + P]
        for item in range(answer.shape[1]):
            values = tied[:, item]
            hit = values == truth[row, item]
            if right and hit.any():
                settled[row, item] = truth[row, item]
            elif not right and not hit.all():
                settled[row, item] = values[~hit][0]
    return settled


def _scores(own: OwnColumns, candidates: Candidates, found: list[Reconstruction],
            truth_labels: np.ndarray, truth_codes: np.ndarray) -> RunResult:
    """F1 of the label and of each private feature with ties broken by the seeded draw, and, for
    the rows with an exact tie, the same F1 with every tie counted wrong and counted right."""
    answer = np.column_stack([np.concatenate([r.labels for r in found]),
                              np.concatenate([r.codes for r in found])])
    truth = np.column_stack([truth_labels, truth_codes])
    ties: dict[int, np.ndarray] = {}
    offset = 0
    for r in found:
        ties |= {offset + row: np.column_stack(tied) for row, tied in r.ties.items()}
        offset += r.labels.size
    two_labels = candidates.labels == 2
    label_f1, features = _f1s(own, two_labels, truth, answer)
    settled = {case: _f1s(own, two_labels, truth, settle_ties(answer, truth, ties, case == "right"))
               for case in ("wrong", "right")}
    labels = answer[:, 0]
    correct = int((labels == truth_labels).sum())
    figures = {"label_f1": label_f1, "feature_f1": features,
               "feature_accuracy": {name: float((answer[:, j + 1] == truth_codes[:, j]).mean())
                                    for j, name in enumerate(own.private_names)},
               "ties": {"rows": len(ties), "of": int(labels.size),
                        **{case: {"label_f1": f1[0], "feature_f1": f1[1]} for case, f1 in settled.items()}},
               "candidates_per_example": candidates.count, "batches": len(found),
               "combinations": math.prod(own.private_cardinalities)}
    return RunResult(correct / labels.size, correct, int(labels.size), figures)
