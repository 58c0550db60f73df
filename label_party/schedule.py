"""The seeded batch schedule the label party drives: train batches with evaluations between."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from splitleak.config import ExperimentConfig
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


@dataclass(frozen=True)
class Plan:
    epochs: int
    batch_size: int
    steps_per_epoch: int
    total_train_steps: int
    eval_interval: int


def make_plan(cfg: ExperimentConfig, num_train: int) -> Plan:
    t = cfg.training
    steps_per_epoch = math.ceil(num_train / t.batch_size)
    total = steps_per_epoch * t.epochs
    if t.max_steps is not None:
        total = min(total, t.max_steps)
    return Plan(t.epochs, t.batch_size, steps_per_epoch, total, t.eval_interval)


def schedule(plan: Plan, train_ids: np.ndarray, test_ids: np.ndarray,
             seed: int) -> Iterator[Batch]:
    """Train batches in a fresh seeded order each epoch; an evaluation pass over the test
    split every `eval_interval` steps (or at each epoch's end when 0) and at the very end."""
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
                yield from _evaluation(plan, test_ids, epoch, step)
        if step >= plan.total_train_steps:
            return


def _evaluation(plan: Plan, test_ids: np.ndarray, epoch: int, step: int) -> Iterator[Batch]:
    chunks = range(0, test_ids.size, plan.batch_size)
    for i, start in enumerate(chunks):
        yield Batch(Phase.EVAL, epoch, step, test_ids[start: start + plan.batch_size],
                    last_of_eval=i == len(chunks) - 1)
