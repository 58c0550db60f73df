"""The seeded batch schedule the label party drives: train batches with evaluations between."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from splitleak.config import ExperimentConfig
from splitleak.integrity import VARIANTS
from splitleak.seeding import rng


class Phase(IntEnum):
    TRAIN = 1  # values match splitleak.v1.Phase
    EVAL = 2


@dataclass(frozen=True)
class Batch:
    phase: Phase
    epoch: int
    step: int  # train step counter (an EVAL batch carries the step it follows)
    sample_ids: np.ndarray  # int64 [B]
    last_of_eval: bool = False  # the final EVAL batch of one evaluation pass
    split: str = "test"  # the rows an EVAL batch scores: "test", or "train" (training.eval_train),
    # or an integrity attack's variant of test rows (splitleak.integrity.VARIANTS)

    @property
    def variant(self) -> str:
        """The integrity attack these EVAL rows are scored under ("" for clean rows)."""
        return self.split if self.split in VARIANTS else ""


@dataclass(frozen=True)
class Plan:
    epochs: int
    batch_size: int
    steps_per_epoch: int
    total_train_steps: int
    eval_interval: int
    eval_train: bool = False  # the final evaluation pass also scores the train rows


def make_plan(cfg: ExperimentConfig, num_train: int) -> Plan:
    t = cfg.training
    steps_per_epoch = math.ceil(num_train / t.batch_size)
    total = steps_per_epoch * t.epochs
    if t.max_steps is not None:
        total = min(total, t.max_steps)
    return Plan(t.epochs, t.batch_size, steps_per_epoch, total, t.eval_interval, t.eval_train)


def schedule(plan: Plan, train_ids: np.ndarray, test_ids: np.ndarray, seed: int,
             variants: list[tuple[str, np.ndarray]] | None = None) -> Iterator[Batch]:
    """Train batches in a fresh seeded order each epoch; an evaluation pass over the test
    split every `eval_interval` steps (or at each epoch's end when 0) and at the very end; the
    last pass also covers the train rows when the plan says `eval_train`. Every pass then
    scores each integrity attack's `variants` rows (splitleak.integrity.variant_rows)."""
    step = 0
    for epoch in range(plan.epochs):
        order = train_ids[rng(seed, "epoch", epoch).permutation(train_ids.size)]
        for start in range(0, order.size, plan.batch_size):
            if step >= plan.total_train_steps:
                break
            yield Batch(Phase.TRAIN, epoch, step, order[start: start + plan.batch_size])
            step += 1
            last = step == plan.total_train_steps
            due = (plan.eval_interval and step % plan.eval_interval == 0) or (
                not plan.eval_interval and start + plan.batch_size >= order.size)
            if due or last:
                splits = [("test", test_ids)]
                if last and plan.eval_train:
                    splits.append(("train", train_ids))
                splits += variants or []
                yield from _evaluation(plan, splits, epoch, step)
        if step >= plan.total_train_steps:
            return


def _evaluation(plan: Plan, splits: list[tuple[str, np.ndarray]], epoch: int,
                step: int) -> Iterator[Batch]:
    """One evaluation pass: each split's rows in batches; the pass's last batch says so."""
    batches = [(split, ids[start: start + plan.batch_size]) for split, ids in splits
               for start in range(0, ids.size, plan.batch_size)]
    for i, (split, ids) in enumerate(batches):
        yield Batch(Phase.EVAL, epoch, step, ids, last_of_eval=i == len(batches) - 1, split=split)
