"""Where a sweep's roles keep their node-local files, and removing them: standard library only,
so that the Ray task removing a point's files on a node starts in a moment (a worker that
imported the engine took 10 s on a loaded machine)."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import suppress
from pathlib import Path

SWEEP_FOLDER = "splitleak-sweep-"  # + an id per sweep run: its folder in a node's temporary directory


def scratch_of(sweep: str, run_name: str) -> Path:
    """The folder on this node where a point's roles keep their node-local files: under the
    node's temporary directory, in `sweep`'s folder (splitleak-sweep-<id>), one per point."""
    return Path(tempfile.gettempdir()) / sweep / run_name


def remove_scratch(sweep: str, run_name: str) -> None:
    """Remove a point's scratch on this node, whatever became of its roles (a role whose process
    was killed never removed its own), then the sweep's folder once no point's is left in it."""
    shutil.rmtree(scratch_of(sweep, run_name), ignore_errors=True)
    with suppress(OSError):  # another point's roles still use it
        scratch_of(sweep, run_name).parent.rmdir()


def remove_role_folder(folder: Path) -> None:
    """A role's scratch folder, then its point's and its sweep's folders once empty."""
    shutil.rmtree(folder, ignore_errors=True)
    for empty in (folder.parent, folder.parent.parent):
        with suppress(OSError):  # other roles' files are still in it
            empty.rmdir()
