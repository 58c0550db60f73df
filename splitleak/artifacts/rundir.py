"""Making a run directory (its resolved config written in) and holding it: one process at a
time, and no symbolic link to write through."""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import torch

from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.run_config import header_line
from splitleak.config import ExperimentConfig


def create_run_dir(cfg: ExperimentConfig, base: Path | None = None, suffix: str = "") -> RunDir:
    """A fresh `runs/<name>-<time>-<hash>` with the resolved config written into it."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    root = (base or cfg.run.output_dir) / f"{cfg.run.name}{suffix}-{stamp}-{cfg.hash[:8]}"
    root.mkdir(parents=True, exist_ok=False)
    run = RunDir(root)
    write_config(cfg, run)
    return run


def write_config(cfg: ExperimentConfig, run: RunDir) -> None:
    """config.toml: the config (resolved, as every CLI and sweep point passes it), with its hash,
    seed and versions."""
    header = (header_line(cfg) +
              f"# python {platform.python_version()}, torch {torch.__version__}, "
              f"grpcio {grpc.__version__}\n")
    run.config.write_text(header + cfg.to_toml())


class LinkedRunDir(ValueError):
    """A run directory holds a symbolic link where this package would write through it."""


def refuse_symlinks(root: Path, *targets: Path) -> None:
    """LinkedRunDir when a symbolic link lies inside `root` (anywhere, or only on the way to
    and under each of `targets`): nothing this package writes is a link, and writing through
    one (a resumed metrics file cut back, a report) would change a file outside the run."""
    found: list[Path] = []
    for target in targets or (root,):
        way = root
        for part in target.relative_to(root).parts:
            way = way / part
            if way.is_symlink():
                found.append(way)
                break
        else:
            for directory, subdirectories, files in os.walk(target):  # links are not followed
                found += [Path(directory) / name for name in (*subdirectories, *files)
                          if (Path(directory) / name).is_symlink()]
    if found:
        link = found[0]
        raise LinkedRunDir(f"{link} is a symbolic link (to {os.readlink(link)}); a run directory "
                           "holds only its own files, and writing through the link would change "
                           "a file outside it: replace the link with the file or directory itself"
                           + (f" ({len(found) - 1} more link(s) in {root})" if len(found) > 1 else ""))


class RunInUse(Exception):
    """Another process holds the run (or sweep) directory: a run, a resume or a sweep of it is
    under way."""


@contextmanager
def exclusive(run: RunDir) -> Iterator[None]:
    """Hold the run directory for this process: an advisory lock on `run.lock`, released when
    the process ends however it ends, so a second run or resume of the same directory is
    refused instead of its parties joining the first one's label party."""
    with holding(run.lock, run.root, "running or resuming it again"):
        yield


@contextmanager
def serving(run: RunDir) -> Iterator[None]:
    """Hold the run directory for this label party: a second label party serving it (by hand,
    with the same --run-dir) would interleave its steps and delete the first one's checkpoints."""
    run.label_party.mkdir(parents=True, exist_ok=True)
    with holding(run.serving_lock, run.root, "serving it with another label party"):
        yield


def held_by(lock: Path) -> str | None:
    """The pid of the process holding `lock` (as `holding` wrote it; "?" if unwritten), or None
    when no process holds it or it does not exist. Probes without creating the file."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(fd, 32).decode(errors="replace").strip() or "?"
    finally:
        os.close(fd)  # releases the probe's own lock too
    return None


@contextmanager
def holding(lock: Path, root: Path, doing: str) -> Iterator[None]:
    """An advisory lock on `lock` (holding the directory `root`) for this process; RunInUse,
    naming the holder's pid, when another process holds it."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunInUse(f"{root} is in use by another splitleak process (pid {holder}): let it "
                       f"end, or stop it, before {doing}") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)
