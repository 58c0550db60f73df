"""Offline leak analysis of a run directory: every attack of the threat model on every logged
batch (R draws of random side knowledge), run-level attacks once per attacker, summarised."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from threadpoolctl import threadpool_limits

from attacker.analysis import parallel
from attacker.analysis.inputs import (
    AnalysisInputError,
    check_run_dir,
    config_warnings,
    configured_attacks,
    cut_short,
    partial_run,
    read_labels,
    read_records,
    read_run_config,
    recording_gaps,
    seed_of,
    set_up,
    threat_of,
)
from attacker.analysis.leak import BatchLeak, attack_rng, evaluate_batch, premise_failed
from attacker.analysis.leak_file import LEAK_SCHEMA, LeakRow, LeakWriter, parquet_batches
from attacker.analysis.run_level import run_level_entries
from attacker.analysis.staging import Outputs, locked_outputs
from attacker.analysis.summary import (
    LeakFigures,
    headline,
    leak_figures,
    marvell_bounds,
    metric_stats,
    summarise_leak,
    with_family,
    write_summary,
)
from attacker.attacks import (
    DEFAULT_ATTACKS,
    DEFAULT_MULTICLASS_ATTACKS,
    HINT_ATTACKS,
    Attack,
    AttackPlugin,
    RunAttack,
    build_attack,
)
from attacker.attacks._batch import SCALAR_ROWS
from attacker.attacks.base import RunFacts, label_without_defaults
from attacker.sidecar.store import GradientLog, LoggedBatch
from splitleak.anchors import CleanAnchors
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.run_config import edited_config
from splitleak.threat import DEFAULT_HINTS

LAYERS = {"cut_gradient": "cut", "first_layer_gradient": "first", "activation": "activation"}
SAMPLED_BATCHES = 5  # early and late batches whose per-row figures feed the plots
NO_CLEAN_ANCHOR = "none"  # a draw's anchor source under a defense when the artifact lacks it
MISSING_ANCHOR = ("no clean anchor for this batch draw in label_party/clean_anchors.arrows (absent, "
                  "damaged or shorter), and under a defense the received row is a noised anchor")
__all__ = ["LEAK_SCHEMA", "AnalysisInputError", "LeakRow", "analyze", "default_attacks", "headline",
           "metric_stats", "summarise_leak", "write_summary"]


def default_attacks(num_classes: int, hints: Iterable[int] = DEFAULT_HINTS) -> list[tuple[str, dict]]:
    """The gradient attacks a run is analysed with when none are named: binary or multi-class."""
    if num_classes > 2:
        return list(DEFAULT_MULTICLASS_ATTACKS)
    specs: list[tuple[str, dict]] = []
    for name, params in DEFAULT_ATTACKS:
        if name in HINT_ATTACKS:
            if params["k"] == 1:  # one entry per requested k, in place of the defaults
                specs += [(name, {"k": k}) for k in hints]
        else:
            specs.append((name, params))
    return specs


def with_hints(specs: list[tuple[str, dict]], hints: Iterable[int]) -> list[tuple[str, dict]]:
    """Named attacks with the threat model's hint counts: a hint attack that names no k runs
    once per count, as in the default set (one that names its k keeps it)."""
    named: list[tuple[str, dict]] = []
    for name, params in specs:
        if name in HINT_ATTACKS and "k" not in params:
            named += [(name, {**params, "k": k}) for k in hints]
        else:
            named.append((name, params))
    return named


@dataclass(frozen=True)
class Attacker:
    """One attacking unit: a passive party, or a colluding group analysed together."""

    parties: tuple[int, ...]
    seed: int  # its side-knowledge seed

    @property
    def key(self) -> str:
        return "+".join(map(str, self.parties))

    @property
    def rng_party(self) -> int | str:
        return self.parties[0] if len(self.parties) == 1 else self.key


class _RowSample:
    """Per-row norms and cosines of the first and last few batches, for the histograms."""

    def __init__(self) -> None:
        # Per batch (party, layer, step, gradients, labels, its random anchor's stream): the
        # figures are computed only for the batches kept, not for each of the log's thousands.
        self.early: dict[tuple[int, str], list[tuple]] = defaultdict(list)
        self.late: dict[tuple[int, str], deque[tuple]] = defaultdict(
            lambda: deque(maxlen=SAMPLED_BATCHES))

    def add(self, party: int, layer: str, step: int, grads: np.ndarray, labels: np.ndarray,
            stream: tuple[int, int, int | str, str]) -> None:
        """`stream`: attack_rng's arguments for the batch's anchor (a positive row's gradient).
        The gradients are copied: a view would hold its whole shard read until the end."""
        early = self.early[(party, layer)]
        batch = (party, layer, step, grads.copy(), labels, stream)
        (early if len(early) < SAMPLED_BATCHES else self.late[(party, layer)]).append(batch)

    @staticmethod
    def _rows(batch: tuple, phase: str) -> list[dict[str, Any]]:
        party, layer, step, grads, labels, stream = batch
        norms = np.linalg.norm(grads, axis=1)
        positives = np.flatnonzero(labels == 1)
        cosine = np.full(labels.shape, np.nan)
        if positives.size:
            anchor = grads[attack_rng(*stream).choice(positives)]
            denominator = norms * np.linalg.norm(anchor)
            np.divide(grads @ anchor, denominator, out=cosine, where=denominator > 0)
        return [{"party_id": party, "layer": layer, "step": step, "label": int(y),
                 "norm": float(n), "cosine_oracle": float(c), "phase": phase}
                for y, n, c in zip(labels, norms, cosine, strict=True)]

    def table(self) -> pa.Table:
        rows = [r for b in self.early.values() for batch in b for r in self._rows(batch, "early")]
        rows += [r for b in self.late.values() for batch in b for r in self._rows(batch, "late")]
        return pa.Table.from_pylist(rows) if rows else pa.table({})


class Analysis:
    """Everything one `analyze` call needs, read once."""

    def __init__(self, run: RunDir, attacks: list[tuple[str, dict]] | None, hints: Iterable[int] | None,
                 seed: int | None, draws: int | None) -> None:
        self.run = run
        config = read_run_config(run)
        self.threat = threat_of(config, run)
        self.run_seed = seed_of(config, run) if seed is None else seed
        self.seed_override = seed
        self.draws = draws or self.threat.draws
        self.hints = list(hints) if hints is not None else None
        self.labels, self.train_ids, self.test_ids = read_labels(run)
        self.num_classes = max(int(self.labels.max()) + 1 if self.labels.size else 2, 2)
        self.configured = configured_attacks(config)
        self.specs = attacks if attacks is not None else self.configured
        field = "attacker.attacks" if attacks is None else "--attacks"
        self.warnings: list[str] = config_warnings(config, self.num_classes, attacks, self.hints,
                                                   field)  # as validate, for what runs
        self.warnings += edited_config(run)  # a config.toml changed since the run
        if self.specs is not None:  # a named list is what runs: say what the threat model adds
            left_out = self.threat.left_out([name for name, _ in self.specs],
                                            "attacker.attacks" if attacks is None else "--attacks")
            self.warnings += [left_out] if left_out else []
        self.anchors: CleanAnchors | None = None  # read once the analysis reaches its batches
        self.missing_anchors: dict[tuple[str, str], int] = defaultdict(int)  # (attack, layer)
        self.top_model, self.perturbed = set_up(config)
        # parties whose gradients the sidecar recorded, and the train steps the run did
        self.tapped = self.threat.curious if (config.get("attacker") or {}).get("enabled", True) \
            else []
        self.train_steps = 0
        self.recording_gap = False  # a sidecar missed records and the run went on
        self.device: str | None = None  # the run-level attacks' device (None: the run's own)
        self.sees_scored_label: set[str] = set()  # labels of attacks no gradient-only bound covers
        self.staged: Callable[[Path], Path] = lambda path: path  # where a run attack writes a file

    def describe(self, parties: str) -> str:
        """The threat model of an attacker by its parties key ("1", "1+2")."""
        return self.threat.describe([int(k) for k in parties.split("+")])

    def facts(self, unit: Attacker) -> RunFacts:
        return RunFacts(self.top_model, self.perturbed, colluding=len(unit.parties) > 1)

    def attacker(self, parties: tuple[int, ...]) -> Attacker:
        seed = self.seed_override if self.seed_override is not None else \
            self.threat.side_seed(parties[0], self.run_seed)
        return Attacker(parties, seed)

    def units(self, available: set[int]) -> list[Attacker]:
        """Every tapped party in the log, then every colluding group whose members all are."""
        groups = [tuple(sorted(g)) for g in self.threat.collusion if set(g) <= available]
        return [self.attacker((k,)) for k in sorted(available)] + [self.attacker(g) for g in groups]

    def run_units(self) -> list[Attacker]:
        """Run-level attackers (ThreatConfig.run_units)."""
        return [self.attacker(parties) for parties in self.threat.run_units]

    def batch_attacks(self, unit: Attacker) -> list[Attack]:
        entry = self.threat.party(unit.parties[0])
        hints = self.hints or (entry.hints if entry is not None else list(DEFAULT_HINTS))
        specs = (with_hints(self.specs, hints) if self.specs is not None
                 else default_attacks(self.num_classes, hints))
        return [a for a in (build_attack(n, p) for n, p in specs) if isinstance(a, Attack)]

    def run_attacks(self, unit: Attacker) -> list[RunAttack]:
        labelled = [e.labelled_per_class for k in unit.parties
                    if (e := self.threat.party(k)) is not None and e.labelled_per_class]
        if self.specs is not None:  # a named model completion takes the threat model's labels,
            # a named reconstruction of a victim its [threat.receiver] rows
            victim = len(unit.parties) == 1 and unit.parties[0] in self.threat.receiver.victims
            built: list[AttackPlugin] = [build_attack(n, {"labelled_per_class": labelled[0], **p}
                                                      if n == "model_completion" and labelled
                                                      else {**self.threat.receiver_params(n), **p}
                                                      if victim else p) for n, p in self.specs]
            return [a for a in built if isinstance(a, RunAttack)]
        built = [build_attack(n, p) for n, p in self.threat.run_attacks(unit.parties)]
        return [a for a in built if isinstance(a, RunAttack)]


def analyze(run_dir: Path, attacks: list[tuple[str, dict]] | None = None,
            hints: Iterable[int] | None = None, seed: int | None = None,
            draws: int | None = None, device: str | None = None,
            jobs: int = 1, out: Outputs | None = None) -> dict[str, Any]:
    """Analyse `run_dir` under its threat model; writes attacker/leak.parquet and
    attacker/rows.parquet and returns the summary (also written by the report). `hints`,
    `seed` and `draws` override the threat model's for every attacker; `device` the run's
    run.devices.attacker for the run-level attacks (model completion, reconstruction); `jobs`
    the worker processes of the batch attacks (the files written are the same whatever it is;
    a caller other than a console script guards its own start with `if __name__ ==
    "__main__"`, as multiprocessing asks). `out`: an analysis's staging, where its files go until
    its report is written too (none: they replace the run's once written, under the run's
    lock: RunInUse while another process runs or analyses it)."""
    run = RunDir(Path(run_dir))
    if out is None:
        check_run_dir(run)
        with locked_outputs(run) as own:
            summary = analyze(run_dir, attacks, hints, seed, draws, device, jobs, own)
            own.commit()
        return summary
    check_run_dir(run)
    analysis = Analysis(run, attacks, hints, seed, draws)
    analysis.device = device
    analysis.staged = out.staged  # a reconstruction's grids are swapped in with the rest
    partial = partial_run(run, records := read_records(run))  # refused now, before the long part
    analysis.train_steps = records.train_steps
    analysis.warnings += _not_for_classes(attacks, analysis.num_classes)
    gaps = recording_gaps(run)
    analysis.warnings += gaps
    analysis.recording_gap = bool(gaps)
    sample = _RowSample()
    attacked: list[GradientLog | None] = []  # the gradient log read (None: the run has none)
    run_entries: list[dict[str, Any]] = []

    def attack_all(tmp: Path) -> None:  # a failure leaves the run's leak.parquet as it was
        with LeakWriter(tmp) as leak:
            attacked.append(_gradient_attacks(analysis, leak, sample, jobs))
        run_entries.extend(run_level_entries(analysis))
        if not run_entries and (attacked[0] is None or not attacked[0].read):
            raise _nothing_to_analyse(run, attacked[0])

    attack_all(out.leak)
    out.analysed = True
    figures = leak_figures(parquet_batches(out.leak), analysis.describe, marvell_bounds(records),
                           analysis.sees_scored_label)
    analysis.warnings += _scalar_rows(figures)
    rows = sample.table()
    if rows.num_rows:
        pq.write_table(rows, out.leak_rows)
    for (attack, layer), count in analysis.missing_anchors.items():
        analysis.warnings.append(
            f"{attack}, {layer} layer: {count} batch draw(s) had no clean anchor from the label "
            f"party ({run.clean_anchors} absent, damaged or shorter than {analysis.draws} draws); "
            "under a defense the received gradient is a noised anchor, so they were skipped as "
            "not applicable, never scored")
    log = attacked[0]
    partial = partial or cut_short(run, records, log.last_step if log else None)
    if partial is not None:
        analysis.warnings.insert(0, _partial_warning(partial))
    summary = {"run_id": (log.run_id if log else "") or run.root.name, "seed": analysis.run_seed,
               "num_classes": analysis.num_classes, "draws": analysis.draws,
               "threat": analysis.threat.model_dump(mode="json"),
               "partial": partial, "warnings": analysis.warnings,
               "leak": [_marked(with_family(e), analysis.sees_scored_label)
                        for e in figures.leak + run_entries],
               "above_bound": figures.above_bound}
    overrides = analysed_with(attacks, analysis.configured, hints, seed, draws)
    return {**summary, "analysed_with": overrides} if overrides else summary


def _partial_warning(partial: dict[str, Any]) -> str:
    """How far a partial run got; for a finished run, why its metrics make it one."""
    if partial["status"] == "ok":  # finished, its metrics.jsonl cut short
        return str(partial["message"])
    return (f"partial run ({partial['status']}"
            f"{'' if partial['step'] is None else ' at step ' + str(partial['step'])}"
            f"): {partial['train_steps_done']} of {partial['train_steps_planned']} "
            "train steps were done; this analyses what was recorded")


def _nothing_to_analyse(run: RunDir, log: GradientLog | None) -> Exception:
    """The refusal of a run with no gradient record to read and no run-level attack; raised
    before leak.parquet is replaced, so the previous results stay."""
    if log is None:
        return FileNotFoundError(f"no gradient log at {run.gradients} and no run-level "
                                 "attack in the threat model: nothing to analyse")
    unread = "; ".join(f"{shard}: {why}" for shard, why in log.unread.items())
    return AnalysisInputError(
        f"no gradient record could be read from {run.gradients} ({unread or 'it holds no shard'})"
        " and no run-level attack in the threat model: nothing to analyse; the previous results "
        "are left as they are")


def _scalar_rows(figures: LeakFigures) -> list[str]:
    """One warning per (attacker, layer) whose direction attacks skipped batches of 1-d rows,
    so that their n/a figures come with the reason (the report's epoch tables say only n/a)."""
    skipped: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for who, layer, attack, batches in figures.scalar_rows:
        skipped[(who, layer)][attack] = batches
    return [f"part{'ies' if '+' in who else 'y'} {who}, {layer} layer: " + ", ".join(
                f"{attack} skipped {batches} batch(es)" for attack, batches in attacks.items())
            + f": {SCALAR_ROWS}, and in those batches every row had the same sign (or, for "
            "cosine_majority, the two signs split the batch evenly), so cosines tell no rows apart"
            for (who, layer), attacks in skipped.items()]


def _marked(entry: dict[str, Any], sees_scored_label: set[str]) -> dict[str, Any]:
    """The entry, flagged when its attack's score of a row uses that row's own label."""
    return {**entry, "sees_scored_label": True} if entry["attack"] in sees_scored_label else entry


def _labels(specs: list[tuple[str, dict]] | None) -> list[str] | None:
    return None if specs is None else [label_without_defaults(build_attack(n, p)) for n, p in specs]


def analysed_with(attacks: list[tuple[str, dict]] | None,
                  configured: list[tuple[str, dict]] | None, hints: Iterable[int] | None,
                  seed: int | None, draws: int | None) -> dict[str, Any]:
    """What an `analyze` call set in place of the run's own config and threat model (the
    summary records it, so `splitleak compare` can tell runs analysed alike from runs that
    were not); {} for none."""
    chosen = _labels(attacks)
    given = {"attacks": chosen if chosen != _labels(configured) else None,
             "hints": None if hints is None else list(hints), "seed": seed, "draws": draws}
    return {key: value for key, value in given.items() if value is not None}


def _gradient_attacks(analysis: Analysis, leak: LeakWriter, sample: _RowSample,
                      jobs: int = 1) -> GradientLog | None:
    """Every batch attack on every logged batch of every attacker, its rows written to `leak` as
    they come, in the same order whatever `jobs` (worker processes of the per-batch attacks);
    the log read (None: the run has none, and run-level attacks to run)."""
    try:
        log = GradientLog(analysis.run.gradients)
    except FileNotFoundError:
        tapped = analysis.tapped
        if tapped and analysis.train_steps and not analysis.recording_gap:
            raise AnalysisInputError(
                f"no gradient log at {analysis.run.gradients}, though the run's threat model taps "
                f"part{'ies' if len(tapped) > 1 else 'y'} {', '.join(map(str, tapped))} and it "
                f"trained {analysis.train_steps} step(s) (moved or deleted?): the batch attacks "
                "have nothing to read, so nothing is analysed; the previous results are left as "
                "they are") from None
        if not analysis.run_units() or not any(analysis.run_attacks(u) for u in analysis.run_units()):
            raise
        why = ("no party was tapped" if not tapped else "the run trained no step"
               if not analysis.train_steps else "the sidecar recorded none: see the gap warning")
        analysis.warnings.append(f"no gradient log ({why}): run-level attacks only")
        return None
    analysis.anchors = CleanAnchors(analysis.run.clean_anchors)
    if analysis.anchors.warning:
        analysis.warnings.append(analysis.anchors.warning)
    units = analysis.units(set(log.parties()))
    scoring = _Scoring(analysis.num_classes, {u.key: (u, analysis.batch_attacks(u)) for u in units})
    logged = sum(s.records for u in units if (p := log.index.parties.get(str(u.parties[0])))
                 for s in p.shards)
    # One BLAS / OpenMP thread here as in every worker: a reduction split over threads sums in
    # another order (k-means, matrix products), so the figures would depend on the machine's
    # cores and on `jobs`.
    with threadpool_limits(1), parallel.batches(jobs, logged, _score, scoring, leak.add) as out:
        for unit in units:
            _unit_attacks(analysis, unit, scoring, log, out, sample)
    analysis.anchors.close()
    analysis.warnings.extend(log.warnings)
    return log


def _unit_attacks(analysis: Analysis, unit: Attacker, scoring: _Scoring, log: GradientLog,
                  out: parallel.Batches[list[LeakRow]], sample: _RowSample) -> None:
    """One attacker's batches: the per-batch attacks to `out` as work (a batch layer's attacks
    one item), the rest made here."""
    built = scoring.units[unit.key][1]
    analysis.sees_scored_label |= {a.label for a in built if a.sees_scored_label}
    facts = analysis.facts(unit)
    epoch_attacks = [a for a in built if a.per_epoch]
    pool = _EpochPool()
    for batch in _unit_batches(log, unit.parties, analysis.warnings):
        ids = batch.sample_ids
        if ids.size and (ids.min() < 0 or ids.max() >= analysis.labels.size
                         or (analysis.labels[ids] < 0).any()):
            where = f" ({batch.shard})" if batch.shard is not None else ""
            raise AnalysisInputError(f"party {unit.key} step {batch.step}{where}: sample ids "
                                     "without a label in the label export (another run's "
                                     "labels, or a damaged shard?)")
        y = analysis.labels[ids]
        if batch.epoch != pool.epoch:
            out.add(pool.evaluate(analysis, unit, epoch_attacks))
            pool = _EpochPool(batch.epoch)
        positive = bool(np.any(y == 1))
        for column, grads in batch.tensors.items():
            layer = LAYERS.get(column)
            if layer is None:
                continue
            tasks: list[_Task] = []  # the layer's attacks, in order: one work item for them all
            for index, attack in enumerate(built):
                if not _applies(attack, layer, analysis.num_classes):
                    continue
                reason = attack.premise(facts, layer)
                if reason is not None:  # skipped with the reason, never scored
                    tasks.append((index, reason, []))
                elif attack.per_epoch:
                    pool.add(layer, batch.step, grads, y)
                else:
                    tasks.append((index, None, _anchors(analysis, unit, batch, layer, attack,
                                                        positive)))
            if any(reason is None for _, reason, _ in tasks):
                out.submit(_Scored(unit.key, layer, batch.epoch, batch.step, grads, y, tasks))
            elif tasks:  # premises alone: nothing for a worker to do
                out.add(_score(scoring, _Scored(unit.key, layer, batch.epoch, batch.step, grads, y,
                                                tasks)))
            if analysis.num_classes == 2 and len(unit.parties) == 1 and layer != "activation":
                sample.add(unit.parties[0], layer, batch.step, grads, y,
                           (unit.seed, batch.step, unit.rng_party, f"{layer}:sample"))
        out.end_batch()
    out.add(pool.evaluate(analysis, unit, epoch_attacks))


@dataclass(frozen=True)
class _Scoring:
    """What scoring a batch needs besides the batch: each attacker by key, with its attacks."""

    num_classes: int
    units: dict[str, tuple[Attacker, list[Attack]]]


Anchor = tuple[tuple[int, np.ndarray] | None, str | None]  # a draw's clean anchor, its source
# An attack on a batch's layer: its index in the attacker's attacks, why its premise fails (None:
# it is scored), each draw's anchor
_Task = tuple[int, str | None, list[Anchor]]


@dataclass(frozen=True)
class _Scored:
    """A batch's layer and its attacks, in order: a work item of `_score` (the gradients sent
    once for them all, not once an attack)."""

    unit: str
    layer: str
    epoch: int
    step: int
    grads: np.ndarray
    labels: np.ndarray
    tasks: list[_Task]


def _anchors(analysis: Analysis, unit: Attacker, batch: LoggedBatch, layer: str, attack: Attack,
             positive: bool) -> list[Anchor]:
    """Each draw's clean anchor and its source, one draw unless the attack is randomised;
    `positive`: the batch has a positive row (without one there is no anchor to draw)."""
    draws = analysis.draws if attack.randomised else 1
    if not attack.needs_clean_anchors or not positive:
        return [(None, None)] * draws
    return [_clean_anchor(analysis, unit, batch, layer, attack, draw) for draw in range(draws)]


def _score(scoring: _Scoring, item: _Scored) -> list[LeakRow]:
    """A batch layer's attacks, in order."""
    return [row for index, reason, anchors in item.tasks
            for row in _attack_rows(scoring, item, index, reason, anchors)]


def _attack_rows(scoring: _Scoring, item: _Scored, index: int, reason: str | None,
                 anchors: list[Anchor]) -> list[LeakRow]:
    """One attack on a batch's layer, once per draw of its random side knowledge; one row
    saying why when its premise fails."""
    unit, built = scoring.units[item.unit]
    attack = built[index]
    if reason is not None:
        result = premise_failed(attack, item.labels.size, scoring.num_classes, reason)
        return [_row(unit, item.layer, item.epoch, item.step, attack, result, 0)]
    rows = []
    for draw, (anchor, source) in enumerate(anchors):
        if source == NO_CLEAN_ANCHOR:  # the attack's premise fails for this draw
            result = premise_failed(attack, item.labels.size, scoring.num_classes, MISSING_ANCHOR)
        else:
            stream = f"{item.layer}:{attack.label}" + (f"#{draw}" if draw else "")  # draw 0: as before draws
            rng = attack_rng(unit.seed, item.step, unit.rng_party, stream)
            result = evaluate_batch(attack, item.grads, item.labels, rng, anchor, scoring.num_classes)
        rows.append(_row(unit, item.layer, item.epoch, item.step, attack, result, draw, source))
    return rows


def _not_for_classes(attacks: list[tuple[str, dict]] | None, num_classes: int) -> list[str]:
    """A warning naming the attacks asked for that rank two classes, on a multi-class run."""
    built = [build_attack(name, params) for name, params in attacks or []]
    binary = [label_without_defaults(a) for a in built
              if isinstance(a, Attack) and not a.applies_to(num_classes)]
    return [f"{', '.join(binary)}: rank two classes, and this run has {num_classes}: not run"] \
        if binary else []


def _applies(attack: Attack, layer: str, num_classes: int) -> bool:
    if not attack.applies_to(num_classes):
        return False
    if layer == "activation":  # what the party sent, not a gradient
        return attack.on_activations
    return layer == "cut" or not attack.cut_layer_only  # logit gradients: the cut layer only


class _EpochPool:
    """One epoch's gradient rows and labels per layer, for attacks run once per epoch."""

    def __init__(self, epoch: int = -1) -> None:
        self.epoch = epoch
        self.rows: dict[str, list[tuple[int, np.ndarray, np.ndarray]]] = defaultdict(list)

    def add(self, layer: str, step: int, grads: np.ndarray, labels: np.ndarray) -> None:
        batches = self.rows[layer]
        if not batches or batches[-1][0] != step:  # several epoch attacks share one copy
            batches.append((step, grads.reshape(grads.shape[0], -1), labels))

    def evaluate(self, analysis: Analysis, unit: Attacker, attacks: list[Attack]) -> list[LeakRow]:
        """One row per (layer, attack) that saw this epoch, at the epoch's last step."""
        rows = []
        for layer, batches in self.rows.items():
            step = batches[-1][0]
            grads = np.concatenate([g for _, g, _ in batches])
            y = np.concatenate([t for _, _, t in batches])
            for attack in attacks:
                if (_applies(attack, layer, analysis.num_classes)
                        and attack.premise(analysis.facts(unit), layer) is None):
                    rng = attack_rng(unit.seed, step, unit.rng_party, f"{layer}:{attack.label}")
                    result = evaluate_batch(attack, grads, y, rng, num_classes=analysis.num_classes)
                    rows.append(_row(unit, layer, self.epoch, step, attack, result, 0))
        return rows


def _clean_anchor(analysis: Analysis, unit: Attacker, batch: LoggedBatch, layer: str, attack: Attack,
                  draw: int) -> Anchor:
    """Draw `draw`'s clean anchor of this batch (cut layer, one party), if the run wrote it, and
    where the anchor comes from: "clean", or NO_CLEAN_ANCHOR when the run did not write it under
    a defense (the draw is skipped, never scored with a noised anchor; counted per layer for the
    warning). Asked only of an attack that needs one, on a batch with a positive row (without
    one the label party writes none: nothing is missing)."""
    if layer == "cut" and len(unit.parties) == 1:
        found = analysis.anchors.get((unit.parties[0], batch.step)) if analysis.anchors else None
        if found is not None and draw < found.sample_ids.size:
            rows = np.flatnonzero(batch.sample_ids == found.sample_ids[draw])
            if rows.size:
                return (int(rows[0]), found.gradients[draw]), "clean"
    if not analysis.perturbed:  # no defense: the received row is the clean gradient
        return None, "clean"
    analysis.missing_anchors[(attack.label, layer)] += 1
    return None, NO_CLEAN_ANCHOR


def _unit_batches(log: GradientLog, parties: tuple[int, ...],
                  warnings: list[str]) -> Iterator[LoggedBatch]:
    """One party's batches, or a group's: the same step of every member, gradients side by side."""
    if len(parties) == 1:
        yield from log.batches(parties[0])
        return
    streams = [log.batches(k) for k in parties]
    current = [next(s, None) for s in streams]
    unmatched = 0
    while all(b is not None for b in current):
        batches = [b for b in current if b is not None]
        step = max(b.step for b in batches)
        if all(b.step == step for b in batches):
            if all(np.array_equal(b.sample_ids, batches[0].sample_ids) for b in batches):
                shared = [c for c in batches[0].tensors if all(c in b.tensors for b in batches)]
                tensors = {c: np.concatenate([b.tensors[c] for b in batches], axis=1) for c in shared}
                yield LoggedBatch(parties[0], batches[0].epoch, step, batches[0].sample_ids, tensors)
            else:
                unmatched += 1
            current = [next(s, None) for s in streams]
        else:  # a member's log lacks this step (a gap): move the lagging ones on
            current = [next(s, None) if b is not None and b.step < step else b
                       for s, b in zip(streams, current, strict=True)]
            unmatched += 1
    if unmatched:
        warnings.append(f"colluding parties {'+'.join(map(str, parties))}: {unmatched} step(s) not "
                        "logged for every member (or with different sample ids) were left out")


def _row(unit: Attacker, layer: str, epoch: int, step: int, attack: Attack, result: BatchLeak,
         draw: int, anchor: str | None = None) -> LeakRow:
    return LeakRow(party_id=unit.parties[0], layer=layer, epoch=epoch, step=step,
                   attack=attack.label, name=attack.name, side_knowledge=attack.side_knowledge,
                   metric=result.metric,
                   auc_raw=result.auc.raw if result.auc else None,
                   auc_flipped=result.auc.flipped if result.auc else None,
                   accuracy=result.accuracy, n_rows=result.n_rows,
                   n_excluded=result.n_excluded, n_pos=result.auc.n_pos if result.auc else None,
                   skip_reason=result.skip_reason, seed=unit.seed, parties=unit.key,
                   draw=draw, skip_kind=result.skip_kind, n_correct=result.n_correct,
                   n_predicted=result.n_predicted, n_no_prediction=result.n_no_prediction,
                   count_error=result.count_error, threshold_accuracy=result.threshold_accuracy,
                   threshold_rule=attack.threshold.words if result.metric == "auc" else None,
                   anchor=anchor if result.skip_reason is None else None)
