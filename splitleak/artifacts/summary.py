"""report/summary.json (the run-level leak entries of `attacker analyze`) and summary.json (how
the run trained): their models, writers and readers."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator, model_validator

from splitleak.artifacts.artifact import Artifact, read_model, write_model
from splitleak.artifacts.paths import RunDir


class SummaryError(ValueError):
    """A summary file that cannot be read; the message names the file and the first bad field."""


# 1: the first versioned layout (files written before have none and read as version 0).
SCHEMA_VERSION = 1


# The statistics of an entry's metric (`flipped`: {"mean": .., "p95": ..}, ...): numbers or null.
STATISTICS = ("mean", "p95", "max", "min", "std", "pooled", "accuracy", "value")
# The entry's fields that hold such statistics (and the one its `metric` names): objects or null.
STATISTIC_GROUPS = ("flipped", "raw", "accuracy", "pooled", "count_error", "threshold_accuracy",
                    "integrity", "ap")


class LeakSummaryEntry(Artifact):
    """One (parties, layer, attack) over the run (scope "run") or an epoch: its identity here;
    the statistics of its metric (`flipped`, `raw`, `accuracy`, `pooled`, `count_error`,
    `spread`, `threshold_accuracy`, a run attack's figures, ...) ride along as further fields."""

    party_id: int
    parties: list[int] | None = None
    layer: str
    attack: str
    name: str | None = None
    scope: str
    epoch: int | None = None
    side_knowledge: str | None = None
    threat: str | None = None
    metric: str | None = None
    seed: int | None = None
    draws: int | None = None
    batches: int | None = None
    skipped: int | None = None
    degenerate: int | None = None
    # a row's score read that row's own label (oracle class centers): an upper bound, outside
    # Marvell's Theorem-1 bound
    sees_scored_label: bool = False

    @model_validator(mode="after")
    def _numbers(self) -> LeakSummaryEntry:
        """A statistic of its metric that is neither a number nor null (a summary.json edited by
        hand: "0.9" in place of 0.9) is refused, naming the entry, the statistic and its value:
        every reader would take it for no figure at all. So is a group of them that is not an
        object ("flipped": 0.9)."""
        groups = (*STATISTIC_GROUPS, self.metric) if self.metric else STATISTIC_GROUPS
        for key, value in (self.model_extra or {}).items():
            if key in groups and value is not None and not isinstance(value, dict):
                raise ValueError(
                    f"{self._named()}: {key} is {value!r}, not an object of statistics (as "
                    "{\"mean\": 0.9, \"p95\": 0.95}) or null")
            for stat, figure in value.items() if isinstance(value, dict) else ():
                if stat in STATISTICS and isinstance(figure, bool | str):
                    raise ValueError(f"{self._named()}: {key}.{stat} is {figure!r}, not a "
                                     "number (a number or null)")
        spread = (self.model_extra or {}).get("spread")
        for path, figure in _leaves(spread, "spread") if spread is not None else ():
            if not isinstance(figure, int | float) or isinstance(figure, bool):
                raise ValueError(f"{self._named()}: {path} is {figure!r}, not a number (the "
                                 "spread across draws: {\"flipped\": {\"p95\": {\"std\": .., "
                                 "\"min\": .., \"max\": ..}}}, numbers or null)")
        return self

    def _named(self) -> str:
        return f"leak entry {self.attack} (party {self.party_id}, {self.layer} layer, {self.scope})"


def _leaves(value: Any, path: str) -> list[tuple[str, Any]]:
    """(dotted path, value) of every leaf of nested objects but null ones."""
    if isinstance(value, dict):
        return [leaf for key, inner in value.items() for leaf in _leaves(inner, f"{path}.{key}")]
    return [] if value is None else [(path, value)]


class LeakSummary(Artifact):
    """report/summary.json."""

    schema_version: int = 0
    run_id: str | None = None
    seed: int | None = None
    num_classes: int | None = None
    draws: int | None = None
    threat: dict[str, Any] | None = None
    partial: dict[str, Any] | None = None
    warnings: list[str] = []
    leak: list[LeakSummaryEntry] = []
    above_bound: list[dict[str, Any]] = []
    # what `attacker analyze` was told in place of the run's config (attacks, hints, seed,
    # draws); absent when it analysed the run as its config says
    analysed_with: dict[str, Any] | None = None

    @field_validator("schema_version")
    @classmethod
    def _known(cls, version: int) -> int:
        """A layout from a newer splitleak is refused, never read as if it were this one's."""
        if version > SCHEMA_VERSION:
            raise ValueError(f"version {version} is newer than the {SCHEMA_VERSION} this splitleak "
                             "reads (written by a newer splitleak?)")
        return version

    @classmethod
    def of(cls, summary: dict[str, Any]) -> LeakSummary:
        """The summary `attacker analyze` built, stamped with this schema version."""
        return cls.model_validate({"schema_version": SCHEMA_VERSION, **summary})


class AnalysisTiming(Artifact):
    """report/timing.json: how long each run-level attack of the analysis took (CPU seconds,
    its trainings' CPU seconds, wall seconds), apart from the summary, whose bytes are the same
    for every analysis of a run."""

    schema_version: int = SCHEMA_VERSION
    run_attacks: list[dict[str, Any]] = []


def describe_analysed_with(overrides: dict[str, Any]) -> str:
    """A summary's `analysed_with` in words, e.g. "attacks norm, clustering(scope=epoch); seed 3"."""
    return "; ".join(f"{key} {', '.join(map(str, value)) if isinstance(value, list) else value}"
                     for key, value in overrides.items())


def read_leak_summary(run: RunDir) -> LeakSummary:
    """SummaryError naming the file and the first bad field when it is not a leak summary."""
    return read_model(run.leak_summary, LeakSummary, SummaryError,
                      "leak summary (the JSON object `attacker analyze` writes)")


class TrainingSummary(Artifact):
    """summary.json: how the run trained (written by the orchestrator, or the engine that
    trained it); `startup` and the roles' devices ride along when the launch was timed."""

    run_id: str
    mode: str
    seconds: float
    train_steps: int
    training_seconds: float = 0.0
    steps_per_second: float | None = None
    final_eval: dict[str, Any] | None = None


def write_training_summary(run: RunDir, summary: TrainingSummary) -> None:
    write_model(run.summary, summary, default=None)


def read_training_summary(run: RunDir) -> TrainingSummary:
    """SummaryError naming the file and the first bad field when it is not a training summary."""
    return read_model(run.summary, TrainingSummary, SummaryError,
                      "training summary (the JSON object a finished run writes)")
