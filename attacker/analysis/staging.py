"""An analysis's files written aside, then swapped in together: until then the run keeps the
previous analysis's leak files, report, plots and summary exactly as they were."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from splitleak.artifacts.paths import TIMING_FILE, RunDir
from splitleak.artifacts.rundir import holding
from splitleak.fileio import fsync_directory
from splitleak.interrupts import interrupts_held

STAGING = ".analysis-"  # the staging folders' names begin so, one in attacker/ and one in report/


class Outputs:
    """Where one analysis writes its files: a staging folder beside each file it replaces (the
    same filesystem, so `commit` renames them into place). Leaving the `with` block removes
    what was not committed."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._folders: dict[Path, Path] = {}  # a run folder -> its staging folder
        self.analysed = False  # the leak files are this analysis's (else the run's are read)
        self.superseded: tuple[str, ...] = ()  # report files (glob patterns) this one replaces

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        for staged in self._folders.values():
            shutil.rmtree(staged, ignore_errors=True)

    def staged(self, target: Path) -> Path:
        """Where this analysis writes the run's file `target`."""
        folder = self._folders.get(target.parent)
        if folder is None:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                folder = Path(tempfile.mkdtemp(prefix=STAGING, dir=target.parent))
            except OSError as err:  # named as the run's folder, not the staging one
                err.filename = str(target.parent)
                raise
            self._folders[target.parent] = folder
        return folder / target.name

    def reserve(self) -> None:
        """Make the staging folders now: a run folder that cannot be written is refused before
        the analysis, not after it."""
        self.staged(self.run.leak)
        self.staged(self.run.report_md)

    @property
    def leak(self) -> Path:
        return self.staged(self.run.leak)

    @property
    def leak_rows(self) -> Path:
        return self.staged(self.run.leak_rows)

    @property
    def report(self) -> Path:
        """The folder report.md and its plots are written to."""
        return self.staged(self.run.report_md).parent

    @property
    def timing(self) -> Path:
        """report/timing.json: how long the run-level attacks took (never in the summary)."""
        return self.staged(self.run.report / TIMING_FILE)

    def written(self, target: Path) -> Path | None:
        """Where this analysis wrote the run's file `target` (None: it wrote none there), or
        the run's own file when the leak files read are the run's (a report alone)."""
        if not self.analysed:
            return target
        folder = self._folders.get(target.parent)
        return None if folder is None else folder / target.name

    def reads(self) -> tuple[Path, Path]:
        """The leak rows and the row sample a report reads: this analysis's once written."""
        return (self.leak, self.leak_rows) if self.analysed else (self.run.leak, self.run.leak_rows)

    def clear_abandoned(self) -> None:
        """Remove the staging folders of analyses that were killed (call it holding the run's
        lock, when no other analysis can be writing)."""
        for folder in (self.run.attacker, self.run.reconstruction, self.run.report):
            for abandoned in folder.glob(STAGING + "*") if folder.is_dir() else ():
                if abandoned not in self._folders.values():
                    shutil.rmtree(abandoned, ignore_errors=True)

    def commit(self) -> None:
        """Rename every written file into place, summary.json last, then remove what this
        analysis replaces without writing it again (a row sample, reconstruction grids, plots
        it did not draw).
        Refused, with nothing changed, when a file's place holds a directory; Ctrl-C waits."""
        moves = [(staged / name, run_folder / name) for run_folder, staged in self._folders.items()
                 for name in sorted(os.listdir(staged))]
        moves.sort(key=lambda move: move[1] == self.run.leak_summary)
        for _, target in moves:
            if target.is_dir() and not target.is_symlink():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
        with interrupts_held():
            for source, _ in moves:
                with source.open("rb") as f:
                    os.fsync(f.fileno())
            for source, target in moves:
                os.replace(source, target)
            self._remove_superseded({target for _, target in moves})
            for run_folder in self._folders:
                fsync_directory(run_folder)

    def _remove_superseded(self, written: set[Path]) -> None:
        stale = [self.run.leak_rows, *self.run.reconstruction.glob("*.npz")] if self.analysed else []
        stale += [path for pattern in self.superseded for path in self.run.report.glob(pattern)]
        for path in stale:
            if path not in written:
                path.unlink(missing_ok=True)


@contextmanager
def locked_outputs(run: RunDir) -> Iterator[Outputs]:
    """An analysis's staging under the run's lock, the abandoned staging of killed analyses
    removed and its own folders made; RunInUse, naming the holder's pid, while another process
    runs or analyses the run (whose staging folders the removal would delete mid-write)."""
    with holding(run.lock, run.root, "analysing it"), Outputs(run) as out:
        out.clear_abandoned()
        out.reserve()
        yield out
