"""A sweep re-run from another working directory, where its relative data paths name other
files, is refused once, up front, before any point runs (data_paths.json records them)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from orchestration.sweep.points import Point
from splitleak.artifacts.paths import RunDir, SweepDir
from splitleak.artifacts.sweep import DataPaths, read_data_paths, write_data_paths
from splitleak.cli_common import BadInput
from splitleak.data_files import data_paths


def check_working_directory(sweep_dir: Path, points: Sequence[Point]) -> None:
    """BadInput (exit 2) naming the folder to run from when a point's data paths now resolve
    to other files than where the sweep ran before; else record where they resolve now."""
    record = SweepDir(sweep_dir).data_paths
    before = read_data_paths(sweep_dir)  # None: a sweep of an earlier version, or none yet
    ran_from, known = (before.working_directory, before.points) if before else (None, {})
    here = os.getcwd()
    now = {p.hash: {key: str(path) for key, path in data_paths(p.config).items()} for p in points}
    moved = [(p, key, then, now[p.hash].get(key)) for p in points
             for key, then in sorted(dict(known[p.hash] if p.hash in known else _trained_on(p)).items())
             if now[p.hash].get(key) != then]
    if moved:
        _, key, then, path = moved[0]
        where = ran_from or "another folder"
        stale = [str(p.run_dir) for p in points if _trained_on(p)]  # checkpoints of old data
        remove = ([str(record)] if ran_from else []) + (
            [f"the run directories of the unfinished points whose checkpoints name the old "
             f"files ({', '.join(stale)})"] if stale else [])
        moved_on_purpose = (f", or, if the data itself moved, remove {' and '.join(remove)} "
                            "(the finished points are kept)" if remove else "")
        raise BadInput(
            f"sweep {sweep_dir} was run from {where}, where its points' {key} named {then}; "
            f"run from {here} it names {path or 'no file'} (a relative path is read from the "
            f"working directory; {len({p.hash for p, *_ in moved})} of {len(points)} points "
            f"differ). Run the sweep from {ran_from or 'the folder it was started in'}, or give "
            "the data file's absolute path in the experiment file (its points are then new "
            f"ones){moved_on_purpose}; nothing was run")
    write_data_paths(sweep_dir, DataPaths(working_directory=here, points=known | now))


def _trained_on(point: Point) -> dict[str, str]:
    """The data files an unfinished point's newest checkpoint records ({}: none, or finished),
    for a sweep that ran before data_paths.json was written."""
    from splitleak.checkpoint import complete_manifests  # imports torch: only when needed

    run = RunDir(point.run_dir)
    if not run.root.is_dir() or run.summary.is_file():
        return {}  # a point that ran to its end is kept, never resumed
    manifests = complete_manifests(run.root)
    return {key: file.path for key, file in manifests[-1].data.items()} if manifests else {}
