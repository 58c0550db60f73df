"""What the report takes from attacker/leak.parquet, reduced as it is read a row group at a time:
per-step means for the leak-over-training plots, skip counts for report.md (never the rows)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from attacker.analysis.leak_file import attackers, parquet_batches

METRIC_COLUMNS = {"auc": "auc_flipped", "accuracy": "accuracy", "count_error": "count_error"}


@dataclass(frozen=True)
class LeakLine:
    """One attack's line in a leak-over-training plot: per step, the mean over the draws of its
    flip-corrected AUC (accuracy, count error); NaN where every draw skipped the batch."""

    attack: str
    metric: str
    steps: np.ndarray
    values: np.ndarray


@dataclass
class _Block:
    """One row group's steps of an attack (sorted), with the running sum and count of each."""

    steps: np.ndarray
    sums: np.ndarray
    counts: np.ndarray

    def take(self, found: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Hands over (and drops) the steps it shares with `found`: their sums go on from here."""
        if not self.steps.size or self.steps[0] > found[-1] or self.steps[-1] < found[0]:
            return self.steps[:0], self.sums[:0], self.counts[:0]
        shared = np.isin(self.steps, found)
        handed = self.steps[shared], self.sums[shared], self.counts[shared]
        self.steps, self.sums, self.counts = self.steps[~shared], self.sums[~shared], self.counts[~shared]
        return handed


class _StepMeans:
    """An attack's values per step: their sum, added one at a time in the order of the rows (as
    Arrow's grouped mean adds them, so the means are the same floats), and their count."""

    def __init__(self, attack: str, metric: str) -> None:
        self.attack, self.metric = attack, metric
        self.blocks: list[_Block] = []

    def add(self, steps: np.ndarray, values: pa.Array) -> None:
        found = np.unique(steps)
        sums, counts = np.zeros(found.size), np.zeros(found.size, dtype=np.int64)
        for block in self.blocks:  # a step whose rows straddle row groups
            shared, block_sums, block_counts = block.take(found)
            at = np.searchsorted(found, shared)
            sums[at], counts[at] = block_sums, block_counts
        valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        at = np.searchsorted(found, steps[valid])
        np.add.at(sums, at, pc.fill_null(values, 0.0).to_numpy(zero_copy_only=False)[valid])
        np.add.at(counts, at, 1)
        self.blocks.append(_Block(found, sums, counts))

    def line(self) -> LeakLine:
        steps = np.concatenate([b.steps for b in self.blocks])
        order = np.argsort(steps, kind="stable")
        sums = np.concatenate([b.sums for b in self.blocks])[order]
        counts = np.concatenate([b.counts for b in self.blocks])[order]
        means = np.full(sums.size, np.nan)
        np.divide(sums, counts, out=means, where=counts > 0)
        return LeakLine(self.attack, self.metric, steps[order], means)


def _columns(path: Path, wanted: list[str]) -> list[str]:
    """The wanted columns the file has (one written before a column existed lacks it)."""
    names = set(pq.read_schema(path).names)
    return [name for name in wanted if name in names]


def leak_lines(path: Path, party: int, layer: str) -> list[LeakLine]:
    """Per attack of the party's rows at `layer` (in the order the attacks first appear), its
    per-step means over draws: what is held is a few numbers per step, never the rows."""
    columns = _columns(path, ["party_id", "layer", "attack", "metric", "step",
                              *METRIC_COLUMNS.values()])
    means: dict[str, _StepMeans] = {}
    for batch in parquet_batches(path)(columns):
        mine = pc.and_(pc.equal(batch["party_id"], party), pc.equal(batch["layer"], layer))
        rows = batch.filter(pc.fill_null(mine, False))
        if not rows.num_rows:
            continue
        codes = pc.dictionary_encode(pc.cast(rows["attack"], pa.string()))  # in order of first row
        attacks, steps = codes.indices.to_numpy(), rows["step"].to_numpy()
        for code, attack in enumerate(codes.dictionary.to_pylist()):
            picked = np.flatnonzero(attacks == code)
            if attack not in means:
                means[attack] = _StepMeans(attack, rows["metric"][int(picked[0])].as_py())
            found = means[attack]
            column = METRIC_COLUMNS.get(found.metric, found.metric)
            if column not in rows.schema.names:
                raise ValueError(f"leak.parquet has no column {column!r} for the {found.metric} "
                                 f"of {attack}")
            found.add(steps[picked], rows[column].take(pa.array(picked)))
    if not means:
        raise ValueError(f"leak.parquet has no rows for party {party}, {layer} layer")
    return [found.line() for found in means.values()]


def skip_counts(path: Path, who: str, layer: str) -> dict[str, int]:
    """How many (attack, batch) pairs of `who` (parties "1", "1+2"; old rows: the party) at
    `layer` each skip reason skipped, in the order the reasons first appear in the file (one row
    group at a time: only the skipped rows' reasons are held, per reason a count)."""
    columns = _columns(path, ["party_id", "parties", "layer", "skip_reason"])
    counts: dict[str, int] = {}
    for batch in parquet_batches(path)(columns):
        mine = pc.and_(pc.equal(attackers(batch), who), pc.equal(batch["layer"], layer))
        reasons = pc.filter(pc.cast(batch["skip_reason"], pa.string()), pc.fill_null(mine, False))
        for found in pc.value_counts(reasons.drop_null()).to_pylist():  # in order of first row
            counts[found["values"]] = counts.get(found["values"], 0) + found["counts"]
    return counts
