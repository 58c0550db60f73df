"""Feature reconstruction from received activations (ALGORITHMS.md §2.11): the rows attacked,
the attacker's auxiliary rows, and the scores (class-conditional SSIM, MSE, per-feature R²)."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from pydantic import Field
from torch.nn import functional as F

from attacker.attacks.base import AttackParams, RunAttack, RunContext, RunResult, label_without_defaults
from attacker.attacks.completion.engine import PartyView, load_parties
from attacker.sidecar.store import GradientLog
from splitleak.fileio import write_atomically
from splitleak.models import Bottom
from splitleak.placement import ATTACKER, role_threads
from splitleak.seeding import rng

GRID_COLUMNS = 10  # examples shown in the report's image grid
ACTIVATION = "activation"


class ReconstructionParams(AttackParams):
    """What both reconstruction attacks share, so they score the same victim rows."""

    auxiliary_fraction: float = Field(0.1, gt=0, lt=1, description="train rows whose features "
                                      "the attacker owns (the decoder's training set); never scored")
    max_rows: int = Field(512, ge=1, le=100_000, description="victim rows scored, drawn from "
                          "the last recorded epoch")


@dataclass
class Rebuilt:
    """What a reconstruction attack produced: the victim rows it rebuilt, as numeric features
    (images) and categorical codes, and the rows whose mean is the prior baseline."""

    view: PartyView  # the victim's real columns (the truth to score against) and trained bottom
    ids: np.ndarray  # [n] rows rebuilt and scored
    prior_ids: np.ndarray  # rows whose mean row is the prior (what a constant guess achieves)
    numeric: torch.Tensor
    categorical: torch.Tensor | None
    figures: dict[str, Any]  # the attack's own figures, reported beside the scores


class FeatureReconstruction(RunAttack):
    """A run-level attack by the label party on one passive party's input features."""

    receiver = True

    @property
    def label(self) -> str:
        """Only the parameters that differ from the defaults (the table stays readable)."""
        return label_without_defaults(self)

    @classmethod
    def attack_performance(cls, entry: dict[str, Any]) -> dict[str, Any]:
        """VFLAIR's AP of a feature reconstruction (TBM, GRN): 1 - MSE of the features scaled
        to [0, 1] by their range, clipped at 0 as VFLAIR clips a negative AP."""
        mse = (entry.get("reconstruction") or {}).get("mse_range")
        return {"metric": "1 - MSE on [0, 1]-scaled features",
                "value": None if mse is None else max(0.0, 1.0 - mse)}

    def run(self, context: RunContext) -> RunResult:
        threads = torch.get_num_threads()
        torch.set_num_threads(role_threads(context.cfg, ATTACKER))  # no oversubscription
        started = time.process_time()
        try:
            rebuilt = self.rebuild(context)
            return score(context, rebuilt.view, rebuilt.ids, rebuilt.prior_ids, self.name,
                         rebuilt.numeric, rebuilt.categorical, time.process_time() - started,
                         **rebuilt.figures)
        finally:
            torch.set_num_threads(threads)

    @abstractmethod
    def rebuild(self, context: RunContext) -> Rebuilt:
        """Rebuild victim rows; ValueError with a sentence when the run lacks what it needs."""


class ReconstructionAttack(FeatureReconstruction):
    """Reconstruction from the activations the label party received (inversion, back-mapping)."""

    params: ReconstructionParams

    def rebuild(self, context: RunContext) -> Rebuilt:
        victim = load_victim(context, self.params, self.name)
        numeric, categorical = self.reconstruct(victim, context.seed)
        aux = np.unique(victim.aux_ids)
        return Rebuilt(victim.view, victim.ids, aux, numeric, categorical,
                       {"epoch": victim.epoch, "auxiliary_rows": int(aux.size)})

    @abstractmethod
    def reconstruct(self, victim: Victim, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The victim rows' numeric features (images) and categorical codes (None: none)."""


@dataclass
class Victim:
    """One passive party under attack: its truth (evaluation only), the rows the attacker owns
    and the activations the label party received."""

    view: PartyView  # the victim's real columns (the truth to score against) and trained bottom
    ids: np.ndarray  # [n] victim rows scored (train rows of the last recorded epoch)
    received: np.ndarray  # [n, d] their activations as received in that epoch
    epoch: int
    aux_ids: np.ndarray  # [m] activation rows of the auxiliary set, every recorded epoch
    aux_received: np.ndarray  # [m, d]

    @property
    def party_id(self) -> int:
        return self.view.party_id

    @property
    def image_shape(self) -> tuple[int, int, int] | None:
        return self.view.inputs.spec.image_shape

    def truth(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self.view.rows(torch.from_numpy(ids))


def load_victim(context: RunContext, params: ReconstructionParams, what: str) -> Victim:
    """Party context.parties[0] as a victim; ValueError with a sentence when the run lacks
    what the attack reads (the recorded activations, the bottom model)."""
    if len(context.parties) != 1:
        raise ValueError(f"{what} attacks one passive party at a time, not the group "
                         f"{'+'.join(map(str, context.parties))}")
    k = context.parties[0]
    view = load_parties(context.run, context.cfg, (k,), context.num_classes)[0]
    draw = rng(context.seed, "reconstruction", "auxiliary", k)
    n_aux = max(1, round(params.auxiliary_fraction * context.train_ids.size))
    aux = np.sort(draw.choice(context.train_ids, size=n_aux, replace=False))
    last, aux_rows = _read_activations(context.run.received, k, aux, what)
    epoch, ids, received = last
    keep = ~np.isin(ids, aux)
    ids, received = ids[keep], received[keep]
    if ids.size == 0:
        raise ValueError(f"{what}: party {k}'s last recorded epoch holds no row outside the "
                         "auxiliary set")
    if ids.size > params.max_rows:
        chosen = np.sort(draw.choice(ids.size, size=params.max_rows, replace=False))
        ids, received = ids[chosen], received[chosen]
    return Victim(view, ids, received, epoch, *aux_rows)


def _read_activations(root: Path, k: int, aux: np.ndarray, what: str
                      ) -> tuple[tuple[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(last epoch, its rows' ids, activations) and every recorded activation of the auxiliary
    rows, from the label party's tap; memory is one epoch of activations plus the auxiliary ones."""
    try:
        log = GradientLog(root)
    except FileNotFoundError:
        raise ValueError(f"{what} reads the activations the label party received from party {k}, "
                         f"but the run has no log of them at {root} (its tap records them when "
                         f"[threat.receiver] victims names the party)") from None
    if k not in log.parties():
        raise ValueError(f"{what}: the log at {root} holds nothing the label party received from "
                         f"party {k} (threat.receiver.victims names {log.parties()})")
    epoch = -1
    ids: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    aux_ids, aux_rows = [], []
    for batch in log.batches(k):
        if ACTIVATION not in batch.tensors:
            raise ValueError(f"{what}: {root} is not a log of received activations")
        h = batch.tensors[ACTIVATION]
        if batch.epoch > epoch:
            epoch, ids, rows = batch.epoch, [], []
        ids.append(batch.sample_ids)
        rows.append(h)
        mine = np.isin(batch.sample_ids, aux)
        aux_ids.append(batch.sample_ids[mine])
        aux_rows.append(h[mine])
    if not ids:
        raise ValueError(f"{what}: party {k}'s log holds no record")
    all_ids, all_rows = np.concatenate(ids), np.concatenate(rows)
    _, last = np.unique(all_ids[::-1], return_index=True)  # a row seen twice: its last record
    last = all_ids.size - 1 - last
    return ((epoch, all_ids[last], all_rows[last]),
            (np.concatenate(aux_ids), np.concatenate(aux_rows)))


def soft_forward(bottom: Bottom, numeric: torch.Tensor, logits: list[torch.Tensor]) -> torch.Tensor:
    """The bottom on a relaxed input: each categorical field as its softmax-weighted embedding
    (so a reconstruction of categorical fields can be found by gradient descent)."""
    if bottom.encoder is None or not logits:
        return bottom(numeric, torch.zeros(numeric.shape[0], 0, dtype=torch.int64))
    fields = cast("Sequence[torch.nn.Embedding]", bottom.encoder.embeddings)  # a ModuleList of them
    embeddings = [F.softmax(z, 1) @ e.weight for z, e in zip(logits, fields, strict=True)]
    parts = ([numeric] if bottom.encoder.num_numeric else []) + embeddings
    return bottom.body(torch.cat(parts, 1))


def ssim_window(image_shape: tuple[int, int, int]) -> int:
    """skimage's window: 7 (its default) or the largest odd side that fits the image."""
    side = min(image_shape[1], image_shape[2])
    win = min(7, side if side % 2 else side - 1)
    if win < 3:
        raise ValueError(f"images of {image_shape[1]}x{image_shape[2]} pixels are too small for "
                         "SSIM (a 3x3 window at least)")
    return win


def _ssim(truth: np.ndarray, rebuilt: np.ndarray, labels: np.ndarray, data_range: float,
          win: int) -> tuple[float, dict[int, float], float]:
    """(class-conditional SSIM, per class, mean over rows): skimage's SSIM per image (channels
    averaged), averaged within each class then over classes, as Luo & Zhang."""
    from skimage.metrics import structural_similarity

    per_row = np.array([structural_similarity(t, r, data_range=data_range, win_size=win,
                                              channel_axis=0)
                        for t, r in zip(truth, rebuilt, strict=True)])
    by_class = {int(c): float(per_row[labels == c].mean()) for c in np.unique(labels)}
    return float(np.mean(list(by_class.values()))), by_class, float(per_row.mean())


def image_scores(truth: np.ndarray, rebuilt: np.ndarray, labels: np.ndarray,
                 pixel_scale: tuple[float, float] | None = None) -> dict[str, Any]:
    """SSIM as the papers compute it: on [0, 1] pixels with data_range = 1 (the images mapped
    back from the party's standardised scale with `pixel_scale` = (mean, std); None: they are
    pixels already; the reconstruction clipped to [0, 1], the range an image takes), class-
    conditional. Beside it, as a labelled diagnostic, the SSIM on the standardised scale with the
    truth's range as data range (what splitleak reported before: the luminance term shifts, so
    it cannot be set beside a paper's). MSE over every value in standardised units; `mse_range`
    on those [0, 1] pixels (VFLAIR's reconstruction AP is 1 minus it)."""
    mean, std = pixel_scale or (0.0, 1.0)
    win = ssim_window(truth.shape[1:])
    pixels = np.clip(truth * std + mean, 0.0, 1.0)
    rebuilt_pixels = np.clip(rebuilt * std + mean, 0.0, 1.0)
    ssim, by_class, rows = _ssim(pixels, rebuilt_pixels, labels, 1.0, win)
    data_range = float(truth.max() - truth.min()) or 1.0
    standardised, _, _ = _ssim(truth, rebuilt, labels, data_range, win)
    return {"ssim": ssim, "ssim_by_class": by_class, "ssim_rows": rows,
            "mse": float(np.mean((truth - rebuilt) ** 2)),
            "mse_range": float(np.mean((pixels - rebuilt_pixels) ** 2)),
            "ssim_window": win, "data_range": 1.0,
            "ssim_standardised": {"ssim": standardised, "data_range": data_range}}


def tabular_scores(numeric: np.ndarray, rebuilt_numeric: np.ndarray, categorical: np.ndarray,
                   rebuilt_categorical: np.ndarray, names: list[str]) -> dict[str, Any]:
    """Per-feature R² of numeric columns and accuracy of categorical ones; the headline is the
    mean R² (the mean accuracy when the party has no numeric column)."""
    from sklearn.metrics import r2_score

    p = numeric.shape[1]
    if p and numeric.shape[0] < 2:  # R² of one row is undefined (scikit-learn: a nan scalar)
        raise ValueError(f"per-feature R² needs at least 2 victim rows, and {numeric.shape[0]} "
                         "was scored (max_rows, or the last recorded epoch's rows outside the "
                         "auxiliary set)")
    r2 = (r2_score(numeric, rebuilt_numeric, multioutput="raw_values").tolist() if p else [])
    accuracy = [float((categorical[:, j] == rebuilt_categorical[:, j]).mean())
                for j in range(categorical.shape[1])]
    spans = np.ptp(numeric, axis=0) if p else np.ones(0)
    spans = np.where(spans > 0, spans, 1.0)
    figures: dict[str, Any] = {"r2": dict(zip(names[:p], map(float, r2), strict=True)),
                               "accuracy": dict(zip(names[p:], accuracy, strict=True)),
                               "mse": float(np.mean((numeric - rebuilt_numeric) ** 2)) if p else None,
                               "mse_range": (float(np.mean(((numeric - rebuilt_numeric) / spans) ** 2))
                                             if p else None)}
    figures["metric"] = "r2" if p else "feature_accuracy"
    figures["value"] = float(np.mean(r2)) if p else float(np.mean(accuracy))
    return figures


def column_names(context: RunContext, party_id: int) -> list[str]:
    """Party `party_id`'s column names from the schema (numeric first, then categorical)."""
    from splitleak.datasets import build_dataset
    from splitleak.partition import passive_columns

    schema = build_dataset(context.cfg.dataset.name, context.cfg.dataset.params).schema()
    start, stop = passive_columns(context.cfg, schema)[party_id]
    return list((*schema.numeric_names, *schema.categorical_names)[start:stop])


def grid_rows(ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Positions of the examples shown in the grid: the first row of each class, then the next
    ones, up to GRID_COLUMNS; the same for every attack on the same victims."""
    order = np.lexsort((ids, labels))
    firsts = order[np.r_[True, labels[order][1:] != labels[order][:-1]]]
    rest = np.setdiff1d(np.arange(ids.size), firsts)
    return np.concatenate([firsts, rest])[:GRID_COLUMNS]


def save_grid(path: Path, ids: np.ndarray, labels: np.ndarray, truth: np.ndarray,
              rebuilt: np.ndarray) -> None:
    """The grid's examples (original and reconstruction) for the report to draw."""
    shown = grid_rows(ids, labels)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with tmp.open("wb") as out:
            np.savez(out, ids=ids[shown], labels=labels[shown], truth=truth[shown],
                     rebuilt=rebuilt[shown])

    write_atomically(path, write)


def grid_path(context: RunContext, attack: str, party: int) -> Path:
    """Where this analysis writes the grid (its staging, swapped in with the leak files)."""
    return context.written(context.run.reconstruction_grid(attack, party))


def score(context: RunContext, view: PartyView, ids: np.ndarray, prior_ids: np.ndarray,
          attack: str, numeric: torch.Tensor, categorical: torch.Tensor | None,
          cpu_seconds: float, **extra: Any) -> RunResult:
    """Score a reconstruction of rows `ids` of the victim `view` against their real features,
    next to the prior baseline (every row rebuilt as the mean of rows `prior_ids`, what the
    attacker could guess without the attack); images also keep the grid's examples for the
    report. `extra` figures are added as they are."""
    labels = context.truth(ids)
    truth_n, truth_c = (t.numpy() for t in view.rows(torch.from_numpy(ids)))
    prior_n, prior_c = view.rows(torch.from_numpy(prior_ids))
    prior = np.broadcast_to(prior_n.mean(0).numpy(), truth_n.shape)
    rebuilt_n = numeric.detach().numpy()
    if not np.isfinite(rebuilt_n).all():
        raise ValueError(f"{attack} diverged: its reconstruction holds NaN or infinite values "
                         "(a smaller lr, or fewer steps, may fit)")
    if view.inputs.spec.image_shape is not None:
        scale = view.inputs.pixel_scale
        figures = image_scores(truth_n, rebuilt_n, labels, scale)
        figures["prior"] = image_scores(truth_n, prior, labels, scale)
        figures["metric"], figures["value"] = "ssim", figures["ssim"]
        save_grid(grid_path(context, attack, view.party_id), ids, labels, truth_n, rebuilt_n)
    else:
        names = column_names(context, view.party_id)
        rebuilt_c = categorical.numpy() if categorical is not None else truth_c[:, :0]
        modes = torch.mode(prior_c, dim=0).values.numpy() if prior_c.shape[1] else truth_c[0, :0]
        figures = tabular_scores(truth_n, rebuilt_n, truth_c, rebuilt_c, names)
        figures["prior"] = tabular_scores(truth_n, prior, truth_c,
                                          np.broadcast_to(modes, truth_c.shape), names)
    figures.update(rows=int(ids.size), cpu_seconds=round(cpu_seconds, 1), **extra)
    return RunResult(accuracy=figures["value"], correct=0, rows=int(ids.size),
                     figures=figures, metric=figures["metric"])
