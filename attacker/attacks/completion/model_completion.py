"""Passive / active model completion (Fu et al.): MixMatch a head onto the party's trained bottom."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from pydantic import Field

from attacker.attacks.base import ATTACKS, AttackParams, RunAttack, RunContext, RunResult
from attacker.attacks.completion.engine import (
    Settings,
    Trainer,
    build_model,
    load_parties,
    random_bottoms,
    top_k_correct,
)
from splitleak.placement import ATTACKER, role_threads
from splitleak.seeding import derive_seed, rng
from splitleak.settings import MAX_BATCH, MAX_ITERATIONS, MAX_RATE, MAX_ROWS


class CompletionParams(AttackParams):
    labelled_per_class: int = Field(4, ge=1, le=MAX_ROWS, description="labelled train rows per class (Fu: 4)")
    steps: int = Field(2000, ge=1, le=MAX_ITERATIONS, description="optimizer steps of each training")
    batch_size: int = Field(16, ge=2, le=MAX_BATCH,  # the head's BatchNorm needs 2 rows
                            description="labelled (and unlabelled) rows per step (Fu: 16)")
    lr: float = Field(2e-3, gt=0, le=MAX_RATE, description="Adam learning rate (Fu: 2e-3)")
    augmentations: int = Field(2, ge=1, le=64, description="K augmented views per unlabelled row")
    temperature: float = Field(0.8, gt=0, le=1, description="sharpening T")
    alpha: float = Field(0.75, gt=0, description="MixUp Beta(α, α)")
    lambda_u: float = Field(50.0, ge=0, description="unlabelled loss weight")
    rampup: float = Field(1.0, gt=0, le=1, description="fraction of the steps λ_u ramps up over")
    ema_decay: float = Field(0.999, ge=0, lt=1, description="EMA of the weights (the model kept)")
    weight_decay: float = Field(0.02, ge=0, le=MAX_RATE, description="MixMatch's per-step θ·(1 − wd·lr)")
    head_layers: int = Field(1, ge=1, le=64, description="(BatchNorm, ReLU, Linear) blocks (Fu: 1)")
    fine_tune_bottom: bool = Field(True, description="train the bottom too (Fu: images yes)")
    max_shift: float = Field(0.075, ge=0, lt=0.5, description="images: random translation up to "
                             "this fraction of the height, in whole pixels (28 px: 2; 8 px: none)")
    noise: float = Field(0.1, ge=0, description="tabular: Gaussian noise on standardised numerics")
    baselines: bool = Field(True, description="also train the labelled-only and random-bottom heads")


@ATTACKS.register("model_completion")
class ModelCompletionAttack(RunAttack):
    name = "model_completion"
    family = "label_inference"
    vflair = "PMC"
    side_knowledge = ("the party's own trained bottom model and feature columns, plus "
                      "labelled_per_class labelled train rows per class (excluded from the "
                      "train accuracy)")
    Params = CompletionParams
    params: CompletionParams

    @property
    def label(self) -> str:
        """Only what differs from the defaults, and always the labelled count. Not `baselines`:
        they add reference figures beside the attack's and leave its own unchanged, so a sweep
        that trains them in its no-defense runs only compares the same attack everywhere."""
        changed = self.params.model_dump(exclude_defaults=True)
        changed.pop("labelled_per_class", None)
        changed.pop("baselines", None)
        args = [f"labelled_per_class={self.params.labelled_per_class}",
                *(f"{k}={v}" for k, v in changed.items())]
        return f"{self.name}({', '.join(args)})"

    @property
    def diagnostic(self) -> str | None:
        if self.params.fine_tune_bottom:
            return None
        return ("the bottom frozen measures the label information training put into it; Fu et "
                "al.'s and the KD^k paper's tables use fine-tuned completion")

    def settings(self) -> Settings:
        p = self.params
        return Settings(steps=p.steps, batch_size=p.batch_size, lr=p.lr,
                        augmentations=p.augmentations, temperature=p.temperature, alpha=p.alpha,
                        lambda_u=p.lambda_u, rampup=p.rampup, ema_decay=p.ema_decay,
                        weight_decay=p.weight_decay, head_layers=p.head_layers,
                        fine_tune_bottom=p.fine_tune_bottom, max_shift=p.max_shift, noise=p.noise)

    def run(self, context: RunContext) -> RunResult:
        threads = torch.get_num_threads()
        torch.set_num_threads(role_threads(context.cfg, ATTACKER))  # no oversubscription
        try:
            return self._run(context)
        finally:
            torch.set_num_threads(threads)

    def _run(self, context: RunContext) -> RunResult:
        started, wall = time.process_time(), time.perf_counter()
        num_classes = context.num_classes
        views = load_parties(context.run, context.cfg, context.parties, num_classes, context.device)
        seed = derive_seed(context.seed, "model_completion", *context.parties)
        labelled, labels = context.labelled_examples(self.params.labelled_per_class,
                                                     rng(seed, "labelled"))
        unlabelled = np.setdiff1d(context.train_ids, labelled)
        if unlabelled.size == 0:
            raise ValueError(f"labelled_per_class = {self.params.labelled_per_class} labels every "
                             f"one of the {context.train_ids.size} train rows: no row is left to "
                             "infer; give fewer labelled rows per class")
        settings = self.settings()
        fit_cpu: list[float] = []  # CPU-s of each training's steps (the rest: loading, scoring)

        def train(use_views: list, with_unlabelled: bool, what: str) -> dict[str, Any]:
            trainer = Trainer(build_model(use_views, num_classes, settings, seed), use_views,
                              num_classes, settings, seed)
            began = time.process_time()
            trainer.fit(labelled, labels, unlabelled if with_unlabelled else None)
            fit_cpu.append(time.process_time() - began)
            return {split: _score(trainer, ids, context.truth(ids), num_classes, what)
                    for split, ids in (("train", unlabelled), ("test", context.test_ids))}

        figures: dict[str, Any] = train(views, True, "its model")
        if self.params.baselines:
            figures["baselines"] = {
                "labelled_only": train(views, False, "its labelled-only baseline"),
                "random_bottom": train(random_bottoms(context.cfg, views, num_classes, seed), True,
                                       "its random-bottom baseline")}
        figures.update(labelled=int(labelled.size), classes=num_classes, steps=settings.steps,
                       cpu_seconds=time.process_time() - started, fit_cpu_seconds=fit_cpu,
                       seconds=time.perf_counter() - wall, device=str(context.device))
        train_split = figures["train"]
        return RunResult(accuracy=train_split["top1"], correct=train_split["correct"],
                         rows=train_split["rows"], figures=figures)


def _score(trainer: Trainer, ids: np.ndarray, truth: np.ndarray, num_classes: int,
           what: str) -> dict[str, Any]:
    """Top-1 (and top-5 for ten or more classes) accuracy pooled over the rows; ValueError when
    the training diverged (`what` it trained), whose NaN logits rank no class."""
    logits = trainer.predict(ids)
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"model completion diverged: {what} gives NaN or infinite logits after "
                         f"{trainer.s.steps} steps at lr = {trainer.s.lr:g} (a smaller lr may fit), "
                         "so it infers no label")
    correct = top_k_correct(logits, truth, 1)
    rows = int(ids.size)
    out: dict[str, Any] = {"top1": correct / rows if rows else None, "correct": correct, "rows": rows}
    if num_classes >= 10:
        out["top5"] = top_k_correct(logits, truth, 5) / rows if rows else None
    return out
