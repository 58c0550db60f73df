"""A sweep re-run from another working directory, where its relative data paths name other
files, is refused once, up front, before any point runs (data_paths.json records them)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from orchestration.sweep.points import Point
from splitleak.artifacts.paths import SweepDir
from splitleak.cli_common import BadInput
from splitleak.data_files import data_paths
from splitleak.fileio import write_atomically


def check_working_directory(sweep_dir: Path, points: Sequence[Point]) -> None:
    """BadInput (exit 2) naming the folder to run from when a point's data paths now resolve
    to other files than where the sweep ran before; else record where they resolve now."""
    record = SweepDir(sweep_dir).data_paths
    try:
        before = json.loads(record.read_text())
        ran_from, known = str(before["working_directory"]), dict(before["points"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ran_from, known = None, {}  # a sweep of an earlier version, or none yet
    here = os.getcwd()
    now = {p.hash: {key: str(path) for key, path in data_paths(p.config).items()} for p in points}
    moved = [(p, key, then, now[p.hash].get(key)) for p in points
             for key, then in sorted(dict(known.get(p.hash) or {}).items())
             if now[p.hash].get(key) != then]
    if moved:
        _, key, then, path = moved[0]
        raise BadInput(
            f"sweep {sweep_dir} was run from {ran_from}, where its points' {key} named {then}; "
            f"run from {here} it names {path or 'no file'} (a relative path is read from the "
            f"working directory; {len({p.hash for p, *_ in moved})} of {len(points)} points "
            f"differ). Run the sweep from {ran_from}, or give the data file's absolute path in "
            "the experiment file (its points are then new ones); nothing was run")
    known |= now
    write_atomically(record, lambda tmp: tmp.write_text(json.dumps(
        {"working_directory": here, "points": known}, indent=1, sort_keys=True) + "\n"))
