"""The run directory's smaller records: which process is which role (pids.json, the
orchestrator's) and what a protecting party did to its images (protection.json, the report's)."""

from __future__ import annotations

import json

from pydantic import TypeAdapter, ValidationError

from splitleak.artifacts.artifact import Artifact
from splitleak.artifacts.paths import RunDir
from splitleak.fileio import write_atomically

_PIDS = TypeAdapter(dict[str, int])


def write_pids(run: RunDir, pids: dict[str, int]) -> None:
    text = json.dumps(pids, indent=2)
    write_atomically(run.pids, lambda tmp: tmp.write_text(text))


def read_pids(run: RunDir) -> dict[str, int] | None:
    """Role -> process id (None before the orchestrator wrote them, or unreadable)."""
    try:
        return _PIDS.validate_json(run.pids.read_bytes())
    except (OSError, ValidationError):
        return None


class Protection(Artifact):
    """passive_party_<k>/protection.json: the protection's name and parameters, the rows it
    replaced, and its figures (window variance, pixel spread, final losses, CPU seconds)."""

    name: str
    rows: int


def read_protection(run: RunDir, party_id: int) -> Protection | None:
    """None when the party wrote none (it did not finish protecting) or it is unreadable."""
    try:
        return Protection.model_validate_json(run.protection(party_id).read_bytes())
    except (OSError, ValidationError):
        return None
