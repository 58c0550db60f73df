"""timing.json of each role: seconds per span over the timed train steps, CPU per step, when it
reached its start-up milestones, and what it ran on (device, threads)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ValidationError

from splitleak.artifacts.artifact import Artifact, write_model


class Span(BaseModel):
    seconds: float
    count: int
    ms_per_step: float


class Timing(Artifact):
    """A role's timing.json; the facts it noted (device, threads) ride along as fields."""

    train_steps: int
    spans: dict[str, Span] = {}
    cpu: dict[str, float] = {}
    startup: dict[str, float] = {}


def write_timing(path: Path, timing: Timing) -> None:
    write_model(path, timing, default=None)


def read_timing_model(path: Path) -> Timing | None:
    """The role's timing.json (None if it wrote none or it is unreadable)."""
    try:
        return Timing.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def read_timing_file(path: Path) -> dict:
    """A role's whole timing.json ({} if it wrote none or it is unreadable)."""
    timing = read_timing_model(path)
    return timing.model_dump(exclude_unset=True) if timing is not None else {}


def read_timing(path: Path) -> dict[str, float]:
    """ms per train step of each span in a role's timing.json ({} if the role wrote none)."""
    if not path.is_file():
        return {}
    timing = Timing.model_validate_json(path.read_bytes())
    return {name: span.ms_per_step for name, span in timing.spans.items()}


def read_cpu(path: Path) -> dict[str, float]:
    """A role's user and system CPU ms per train step from its timing.json ({} if none)."""
    if not path.is_file():
        return {}
    return Timing.model_validate_json(path.read_bytes()).cpu
