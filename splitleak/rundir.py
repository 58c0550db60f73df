"""Where the run directory's names were before splitleak.artifacts (kept for modules not yet
moved to it)."""

from splitleak.artifacts.outcome import read_outcome, write_outcome
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import (
    LinkedRunDir,
    RunInUse,
    create_run_dir,
    exclusive,
    refuse_symlinks,
    write_config,
)

__all__ = ["LinkedRunDir", "RunDir", "RunInUse", "create_run_dir", "exclusive", "read_outcome",
           "refuse_symlinks", "write_config", "write_outcome"]
