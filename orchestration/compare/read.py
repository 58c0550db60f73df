"""What the comparison reads from a run directory: its config, final utility (metrics.jsonl) and
run-level leak (report/summary.json, through orchestration.compare.entries), and which runs a
sweep directory's index says are finished."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestration.compare.entries import LeakEntry, leak_entries, number
from orchestration.compare.identity import SweepPoint, finished_points
from splitleak.artifacts.metrics_log import read_metrics_log
from splitleak.artifacts.outcome import read_outcome_or_refuse
from splitleak.artifacts.paths import CONFIG_FILE, SWEEP_INDEX_FILE, RunDir, is_run_dir, is_sweep_dir
from splitleak.artifacts.run_config import edited_config
from splitleak.artifacts.summary import (
    LeakSummary,
    SummaryError,
    read_leak_summary,
    read_training_summary,
)
from splitleak.artifacts.sweep import read_index_rows
from splitleak.config import ConfigError, ExperimentConfig, load_config


def utility_metric(num_classes: int) -> str:
    return "test_auc" if num_classes == 2 else "test_accuracy"


@dataclass(frozen=True)
class RunResult:
    """A finished, analysed run as the comparison sees it."""

    root: Path
    config: ExperimentConfig
    point: SweepPoint | None  # what its sweep's index says of it (None outside a sweep)
    num_classes: int
    final_eval: dict[str, Any]
    leak: list[LeakEntry]
    ms_per_step: float | None = None  # median train step (metrics.jsonl's clock)
    curve: tuple[tuple[float, float], ...] = ()  # (seconds, utility) of each evaluation
    bytes_per_step: float | None = None  # both directions at the label party (outcome.json)
    analysed_with: dict[str, Any] | None = None  # `attacker analyze`'s options its config lacks
    notes: tuple[str, ...] = ()  # what to warn of: a partial run, an edited config.toml
    mode: str | None = None  # how it trained (summary.json: distributed, in-process, ray)

    @property
    def seed(self) -> int:
        return self.config.run.seed

    @property
    def label(self) -> str | None:
        """The sweep's name for its setting (None outside a sweep)."""
        return self.point.setting if self.point is not None else None

    @property
    def utility_metric(self) -> str:
        return utility_metric(self.num_classes)

    @property
    def utility(self) -> float | None:
        return number(self.final_eval.get(self.utility_metric))

    def network(self, compact: bool = False) -> str:
        """Its [network] in words; `in-process` for a run trained in one process, whose
        parties exchange no messages over any network."""
        return "in-process" if self.mode == "in-process" else self.config.network.describe(compact)


def read_run(root: Path, point: SweepPoint | None = None) -> RunResult:
    """Raises ValueError saying what is missing or unreadable (naming the file) when the run
    cannot be compared."""
    run = RunDir(root)
    for needed, why in ((run.config, ""), (run.metrics, ""),
                        (run.leak_summary, " (run `attacker analyze` on it)")):
        if not needed.exists():
            raise ValueError(f"{root}: no {needed.relative_to(root)}{_why_missing(run) or why}")
    try:
        config = load_config(run.config)
    except ConfigError as err:
        raise ValueError(f"{root}: {err}") from None
    metrics = read_metrics_log(run.metrics)
    evals = metrics.evals
    summary = read_leak_summary(run)
    num_classes = int(summary.num_classes or metrics.plan.get("num_classes") or 2)
    metric = utility_metric(num_classes)
    outcome = read_outcome_or_refuse(run)
    notes = _partial(root, summary, outcome) + edited_config(run, config)
    try:
        leak = leak_entries(summary)
    except ValueError as err:
        raise ValueError(f"{run.leak_summary}: {err}") from None
    return RunResult(root, config, point, num_classes, evals[-1] if evals else {},
                     leak, metrics.ms_per_step,
                     tuple(metrics.utility_curve(metric)), _bytes_per_step(outcome, metrics.train_steps),
                     _not_its_config(summary.analysed_with, config), tuple(notes), _mode(run))


def _mode(run: RunDir) -> str | None:
    """How the run trained, from its summary.json (None: none, or unreadable)."""
    try:
        return read_training_summary(run).mode
    except (SummaryError, OSError):
        return None


def _why_missing(run: RunDir) -> str | None:
    """Why a run directory lacks a file compare reads, when another process holds it: the run
    (or its analysis) is still under way, and `attacker analyze` would be refused."""
    from splitleak.artifacts.rundir import held_by

    pid = held_by(run.lock)
    return None if pid is None else (f": it is still being run or analysed (pid {pid} holds "
                                     f"{run.lock.name}); compare it once that has finished")


def _not_its_config(overrides: dict[str, Any] | None,
                    cfg: ExperimentConfig) -> dict[str, Any] | None:
    """The options `attacker analyze` was given that differ from what the run's config says
    (a --seed, --draws or --hints equal to the config's own changes nothing)."""
    if not overrides:
        return None
    own: dict[str, Any] = {"seed": cfg.run.seed, "draws": cfg.threat.draws}
    hints = {tuple(party.hints) for party in cfg.threat.parties.values()}
    if len(hints) == 1:
        own["hints"] = list(hints.pop())
    differing = {k: v for k, v in overrides.items() if k not in own or own[k] != v}
    return differing or None


def _partial(root: Path, summary: LeakSummary, outcome: dict[str, Any]) -> list[str]:
    """A warning when the run did not finish (its analysis or its outcome.json says so)."""
    partial = summary.partial or ({"status": outcome.get("status"), "step": outcome.get("step")}
                                  if outcome and outcome.get("status") != "ok" else None)
    if partial is None:
        return []
    if partial.get("status") == "ok":  # it finished, its metrics.jsonl cut short: the analysis's
        return [f"{root}: {partial.get('message')}"]  # own words, not "before it stopped"
    step = partial.get("step")
    return [f"{root}: partial run ({partial.get('status')}"
            f"{'' if step is None else f' at step {step}'}): its utility and leak are of the steps "
            "it did before it stopped, not of the training its config plans"]


def _bytes_per_step(outcome: dict[str, Any], steps: int) -> float | None:
    """Bytes the label party sent and received per step (of `steps` train steps), evaluation
    passes included."""
    sent, received = outcome.get("bytes_sent"), outcome.get("bytes_received")
    if not steps or not isinstance(sent, int) or not isinstance(received, int):
        return None
    return (sent + received) / steps


def not_done(sweep_dir: Path) -> list[str]:
    """A warning when some of a sweep's points are not done (pending, interrupted, failed):
    the comparison covers the done ones only."""
    statuses = Counter(row.status for row in read_index_rows(sweep_dir))
    done = statuses.pop("done", 0)
    if not statuses:
        return []
    what = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    return [f"{sweep_dir}: {sum(statuses.values())} of {done + sum(statuses.values())} points are "
            f"not done ({what}); this comparison covers the {done} done"]


def _once(found: list[tuple[Path, SweepPoint | None]],
          warnings: list[str]) -> list[tuple[Path, SweepPoint | None]]:
    """Each run once, however often it was named (a sweep and one of its points; a run twice),
    as its sweep names it where one does."""
    kept: dict[Path, tuple[Path, SweepPoint | None]] = {}
    for root, point in found:
        key = root.resolve()
        if key in kept:
            warnings.append(f"{root}: given twice (also as {kept[key][0]}); compared once")
            if kept[key][1] is not None or point is None:
                continue
        kept[key] = (root, point)
    return list(kept.values())


def find_runs(paths: list[Path]) -> tuple[list[RunResult], list[str]]:
    """Runs under each path (a sweep directory: its finished points; a run directory; or a
    directory of run directories) and a warning for each one found inside a directory that
    cannot be compared. ValueError when a path is none of these, or a run directory given
    itself cannot be compared (the user named it: bad input, never skipped)."""
    found: list[tuple[Path, SweepPoint | None]] = []
    named: set[Path] = set()
    warnings: list[str] = []
    for path in paths:
        if is_sweep_dir(path):
            found += finished_points(path)
            warnings += not_done(path)
        elif is_run_dir(path):
            found.append((path, None))
            named.add(path)
        elif path.is_dir() and any(is_run_dir(child) for child in path.iterdir()):
            found += [(child, None) for child in sorted(path.iterdir()) if is_run_dir(child)]
        else:
            raise ValueError(f"{path}: not a sweep directory (no {SWEEP_INDEX_FILE}), a run "
                             f"directory (no {CONFIG_FILE}) or a directory of run directories")
    runs = []
    for root, point in _once(found, warnings):
        try:
            runs.append(read_run(root, point))
        except ValueError as err:
            if root in named:
                raise
            warnings.append(f"skipped: {err}")
            continue
        warnings += runs[-1].notes
    return runs, warnings
