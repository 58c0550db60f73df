"""label_party/outcome.json: how the run ended (ok / failed / interrupted), written by the
label party (or, for a process that failed before the label party could conclude, by the
orchestrator), read by the orchestrator, the analysis and the comparison."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from splitleak.artifacts.artifact import Artifact, read_model, write_model
from splitleak.artifacts.paths import RunDir


class OutcomeError(ValueError):
    """An outcome.json that is there but cannot be read; the message names the file and why."""


class Outcome(Artifact):
    """`status` first; a failure's `code`, `party`, `culprit`, `message`, `step`, a finished
    run's `seconds`, `train_steps`, `defenses`, `objective`, `bytes_sent`, `bytes_received`
    ride along as written."""

    status: str


def write_outcome(run: RunDir, outcome: dict[str, Any]) -> None:
    write_model(run.outcome, Outcome.model_validate(outcome), default=str)


def read_outcome(run: RunDir) -> dict[str, Any]:
    """The outcome, or {} when there is none (yet) or it cannot be read."""
    outcome = read_outcome_model(run)
    return outcome.as_dict() if outcome is not None else {}


def read_outcome_model(run: RunDir) -> Outcome | None:
    """The outcome, or None when there is none (yet) or it cannot be read."""
    try:
        return Outcome.model_validate_json(run.outcome.read_bytes())
    except (OSError, ValidationError):
        return None


def read_outcome_or_refuse(run: RunDir) -> dict[str, Any]:
    """The outcome, or {} when there is none (yet); OutcomeError naming the file and why when
    it is there but cannot be read (a directory, not JSON, no "status")."""
    outcome = read_outcome_model_or_refuse(run)
    return outcome.as_dict() if outcome is not None else {}


def read_outcome_model_or_refuse(run: RunDir) -> Outcome | None:
    """The outcome, or None when there is none (yet); OutcomeError as read_outcome_or_refuse."""
    if not run.outcome.exists():
        return None
    return read_model(run.outcome, Outcome, OutcomeError,
                      'outcome (a JSON object with a "status" such as "ok" or "failed")')
