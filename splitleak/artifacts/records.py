"""The run directory's smaller records: which process is which role (pids.json, the
orchestrator's), what a protecting party did to its images (protection.json, the report's) and
what a tapped party's sidecar recorded (tap.json, the analysis')."""

from __future__ import annotations

import json

from pydantic import TypeAdapter, ValidationError

from splitleak.artifacts.artifact import Artifact, write_model
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


class TapReport(Artifact):
    """passive_party_<k>/tap.json: the records the party's tap sent and the sidecar acknowledged,
    and the gap it left when the run went on without it (attacker.on_sidecar_failure)."""

    sent: int
    # Every record the sidecar took when the stream closed; when it broke, those its last
    # checkpoint found logged; None: the sidecar confirmed none before the break.
    acknowledged: int | None
    gap_records: int
    gap_first_step: int | None = None
    error: str | None = None


def write_tap_report(run: RunDir, party_id: int, report: TapReport) -> None:
    write_model(run.tap(party_id), report)


def read_tap_reports(run: RunDir) -> dict[int, TapReport]:
    """Party -> its tap report, for every party that wrote a readable one."""
    reports = {}
    for k in run.passive_party_ids():
        try:
            reports[k] = TapReport.model_validate_json(run.tap(k).read_bytes())
        except (OSError, ValidationError):
            continue
    return reports
