"""The integrity attacks a malicious passive party runs when [threat] declares them (VFLAIR's LRB,
NSB and MF; ALGORITHMS.md §2.16-2.18): its triggered, noisy or missing rows, and which rows of a
train batch it swaps. Stateless: every draw is seeded, so a resumed party does the same."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from splitleak.config import ExperimentConfig
from splitleak.datasets import Dataset, train_test_ids
from splitleak.inputs import PartyInputs
from splitleak.integrity import known_targets, missing_mask, poisoned_rows
from splitleak.seeding import generator, rng
from splitleak.threat import MissingFeatures, NoisySamples, ReplacementBackdoor

# VFLAIR's MNIST trigger, moved to the bottom-right corner of the party's image slice:
# (H-1, W-1), (H-2, W-2), (H-3, W-1), (H-1, W-3) set to the trigger value.
TRIGGER_PIXELS = ((1, 1), (2, 2), (3, 1), (1, 3))


@dataclass(frozen=True)
class Swap:
    """A train batch's rows whose activation the backdoor party replaces, and by which row's."""

    rows: torch.Tensor  # positions in the batch of its known target rows
    poisoned: int  # the sample id whose triggered activation is sent in their place


class PartyIntegrity:
    """What one passive party does differently from an honest one."""

    def __init__(self, cfg: ExperimentConfig, party_id: int, inputs: PartyInputs,
                 targets: np.ndarray | None) -> None:
        entry = cfg.threat.party(party_id)
        assert entry is not None and entry.integrity
        self.party_id = party_id
        self.seed = cfg.run.seed
        self.backdoor: ReplacementBackdoor | None = entry.backdoor
        self.noisy: NoisySamples | None = entry.noisy_samples
        self.missing: MissingFeatures | None = entry.missing_features
        train_ids, _ = train_test_ids(inputs.num_rows, cfg.dataset.test_fraction, cfg.run.seed)
        train = inputs.numeric[torch.from_numpy(train_ids)]
        images = inputs.spec.image_shape is not None
        # The range of the party's train values: images over every pixel, tables per column.
        self.low = train.amin() if images else train.amin(0)
        self.high = train.amax() if images else train.amax(0)
        self.images = images
        self.targets = targets if targets is not None else np.zeros(0, dtype=np.int64)
        self.poisoned = (poisoned_rows(cfg, inputs.num_rows, party_id, self.backdoor)
                         if self.backdoor is not None else np.zeros(0, dtype=np.int64))

    def trigger(self, numeric: torch.Tensor) -> torch.Tensor:
        """The rows with the backdoor's trigger: VFLAIR's 4-pixel pattern in the slice's
        bottom-right corner (images), or the first numeric column (tables), set to the trigger
        value (default: the largest train value, a white pixel)."""
        assert self.backdoor is not None
        value = self.backdoor.trigger_value
        out = numeric.clone()
        if self.images:
            for dy, dx in TRIGGER_PIXELS:
                out[..., -dy, -dx] = float(self.high) if value is None else value
        else:
            out[:, 0] = float(self.high[0]) if value is None else value
        return out

    def noised(self, numeric: torch.Tensor, sample_ids: np.ndarray) -> torch.Tensor:
        """VFLAIR's noisy samples: x + N(0, (λ·range)²), clipped to the range; each row's noise
        is fixed by (run seed, party, sample id), so every evaluation sees the same rows."""
        assert self.noisy is not None
        low, high = self.low.to(numeric.device), self.high.to(numeric.device)
        noise = torch.stack([torch.randn(numeric.shape[1:], generator=generator(
            self.seed, "noisy_samples", self.party_id, int(i))) for i in sample_ids])
        noise = noise.to(numeric.device)  # drawn on the CPU: the same rows on every device
        return torch.minimum(torch.maximum(numeric + self.noisy.noise_lambda * (high - low) * noise,
                                           low), high)

    def rows(self, inputs: PartyInputs, sample_ids: np.ndarray,
             variant: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The party's input for EVAL rows scored under `variant` ("" = clean)."""
        numeric, categorical = inputs.rows(torch.from_numpy(sample_ids))
        if variant == "backdoor" and self.backdoor is not None:
            numeric = self.trigger(numeric)
        elif variant == "noisy" and self.noisy is not None:
            numeric = self.noised(numeric, sample_ids)
        return numeric, categorical

    def zeroed(self, rows: int, train: bool, step: int, variant: str) -> torch.Tensor | None:
        """Rows whose output the party sends as zero (missing features), or None."""
        if self.missing is None:
            return None
        if train:
            if not self.missing.during_training:
                return None
            return torch.from_numpy(missing_mask(self.seed, self.party_id, step, rows, self.missing))
        return torch.ones(rows, dtype=torch.bool) if variant == "missing" else None

    def swap(self, sample_ids: np.ndarray, epoch: int) -> Swap | None:
        """The backdoor's replacement in a train batch: its known target rows, and the poisoned
        row (VFLAIR: one per epoch, drawn from the poisoned train rows) sent in their place."""
        if self.backdoor is None:
            return None
        rows = np.flatnonzero(np.isin(sample_ids, self.targets))
        if rows.size == 0:
            return None
        pick = rng(self.seed, "backdoor", "epoch", self.party_id, epoch).integers(self.poisoned.size)
        return Swap(torch.from_numpy(rows), int(self.poisoned[pick]))


def party_integrity(cfg: ExperimentConfig, party_id: int, dataset: Dataset,
                    inputs: PartyInputs) -> PartyIntegrity | None:
    """The party's integrity attacks, or None for an honest party (the usual code path)."""
    entry = cfg.threat.party(party_id)
    if entry is None or not entry.integrity:
        return None
    targets = (known_targets(cfg, dataset, party_id, entry.backdoor)
               if entry.backdoor is not None else None)
    return PartyIntegrity(cfg, party_id, inputs, targets)
