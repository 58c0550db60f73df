"""A run directory's config.toml: the hash its header line records, and whether its content still has it."""

from __future__ import annotations

import re
from pathlib import Path

from splitleak.artifacts.paths import RunDir, is_run_dir
from splitleak.config import ConfigError, ExperimentConfig, load_config

HEADER = re.compile(r"# resolved config; hash ([0-9a-f]+); seed (-?\d+)")  # of header_line's


def header_line(cfg: ExperimentConfig) -> str:
    """The first line of a run's config.toml (splitleak.artifacts.rundir.write_config)."""
    return f"# resolved config; hash {cfg.hash}; seed {cfg.run.seed}\n"


def recorded_hash(config: Path) -> str | None:
    """The hash the header line of `config` records (None: no such header, or unreadable)."""
    try:
        with config.open(encoding="utf-8", errors="replace") as file:
            found = HEADER.match(file.readline())
    except OSError:
        return None
    return found.group(1) if found else None


def written_by_a_run(root: Path) -> bool:
    """`root` is a run directory splitleak made: its config.toml opens with the header line."""
    return is_run_dir(root) and recorded_hash(RunDir(root).config) is not None


def edited_config(run: RunDir, cfg: ExperimentConfig | None = None) -> list[str]:
    """A warning when the content of the run's config.toml no longer hashes to what its header
    line records: edited after the run (or written by a splitleak whose defaults differ), so it
    may not describe what the run trained. A warning, not a refusal: old runs stay readable."""
    recorded = recorded_hash(run.config)
    if recorded is None:
        return []
    if cfg is None:
        try:
            cfg = load_config(run.config)
        except ConfigError:
            return []  # the reader that needs it says why
    if cfg.hash == recorded:
        return []
    return [f"{run.config}: its content hashes to {cfg.hash}, not to the hash {recorded} its "
            "header line records: it was edited after the run (or written by a splitleak version "
            "with other defaults), so it may not describe what the run trained"]
