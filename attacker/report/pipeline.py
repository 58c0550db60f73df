"""A run's whole analysis (leak files, report, summary), as `attacker analyze`, `splitleak run`
and sweeps make it: under the run's lock, its files swapped in together once all are written."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attacker.analysis.analyze import analyze
from attacker.analysis.inputs import check_run_dir
from attacker.analysis.staging import locked_outputs
from attacker.analysis.summary import write_summary
from attacker.report.report import write_report
from splitleak.artifacts.paths import RunDir

STOPPED = "the run's previous analysis (leak files, report, summary) is as it was"


def analyse_and_report(run_dir: Path, attacks: list[tuple[str, dict]] | None = None,
                       hints: Iterable[int] | None = None, seed: int | None = None,
                       draws: int | None = None, device: str | None = None,
                       jobs: int = 1) -> dict[str, Any]:
    """Analyse `run_dir` (as `analyze` does, with its arguments) and write its report and
    summary; RunInUse, naming the holder's pid, while another process runs or analyses it.
    Whatever fails or stops it, the run keeps its previous analysis's files as they were."""
    run = RunDir(Path(run_dir))
    check_run_dir(run)
    with locked_outputs(run) as out:
        summary = analyze(run.root, attacks, hints, seed, draws, device, jobs, out)
        write_report(run, summary, out)
        write_summary(run, summary, out)
        out.commit()
    return summary
