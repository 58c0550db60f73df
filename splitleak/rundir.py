"""The run directory layout (DESIGN.md §6), in one place."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import torch

from splitleak.config import ExperimentConfig
from splitleak.fileio import write_atomically


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def label_party(self) -> Path:
        return self.root / "label_party"

    @property
    def metrics(self) -> Path:
        return self.label_party / "metrics.jsonl"

    @property
    def labels(self) -> Path:
        return self.label_party / "labels.parquet"

    @property
    def clean_anchors(self) -> Path:
        """Evaluation-only clean (pre-defense) gradients of a few positives (splitleak.anchors)."""
        return self.label_party / "clean_anchors.arrows"

    @property
    def white_box(self) -> Path:
        """Evaluation-only snapshots of the label party's model per step (splitleak.white_box)."""
        return self.label_party / "white_box"

    @property
    def top_model(self) -> Path:
        return self.label_party / "top.pt"

    @property
    def outcome(self) -> Path:
        return self.label_party / "outcome.json"

    def passive_party(self, party_id: int) -> Path:
        return self.root / f"passive_party_{party_id}"

    def bottom_model(self, party_id: int) -> Path:
        return self.passive_party(party_id) / "bottom.pt"

    def bottom_white_box(self, party_id: int) -> Path:
        """Evaluation-only snapshots of a victim's bottom and its gradients per step (CAFE's
        threat model, splitleak.white_box)."""
        return self.passive_party(party_id) / "white_box"

    def protection(self, party_id: int) -> Path:
        """What a protecting party did to its train images ([protection]), for the report."""
        return self.passive_party(party_id) / "protection.json"

    @property
    def label_party_address(self) -> Path:
        """HOST:PORT, written by the label party once it serves (a run's roles meet here)."""
        return self.label_party / "address"

    @property
    def attacker_address(self) -> Path:
        return self.attacker / "address"

    def relay_address(self, party_id: int) -> Path:
        """With [network]: where passive party k's shaping relay listens."""
        return self.root / f"relay_{party_id}.address"

    @property
    def routed_address(self) -> Path:
        """Where the orchestrator routed the passive parties instead (the bench's relay)."""
        return self.root / "routed.address"

    @property
    def tls(self) -> Path:
        return self.root / "tls"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def attacker(self) -> Path:
        return self.root / "attacker"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"


def create_run_dir(cfg: ExperimentConfig, base: Path | None = None, suffix: str = "") -> RunDir:
    """A fresh `runs/<name>-<time>-<hash>` with the resolved config written into it."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    root = (base or cfg.run.output_dir) / f"{cfg.run.name}{suffix}-{stamp}-{cfg.hash[:8]}"
    root.mkdir(parents=True, exist_ok=False)
    run = RunDir(root)
    write_config(cfg, run)
    return run


def write_config(cfg: ExperimentConfig, run: RunDir) -> None:
    header = (f"# resolved config; hash {cfg.hash}; seed {cfg.run.seed}\n"
              f"# python {platform.python_version()}, torch {torch.__version__}, "
              f"grpcio {grpc.__version__}\n")
    run.config.write_text(header + cfg.to_toml())


def write_outcome(run: RunDir, outcome: dict[str, Any]) -> None:
    """label_party/outcome.json: ok / failed (code, party, culprit, message, step) /
    interrupted, written by the label party (or, for a process that failed before the label
    party could conclude, by the orchestrator)."""
    text = json.dumps(outcome, indent=2, default=str)
    write_atomically(run.outcome, lambda tmp: tmp.write_text(text))


def read_outcome(run: RunDir) -> dict[str, Any]:
    """The outcome, or {} when there is none (yet) or it cannot be read."""
    try:
        outcome = json.loads(run.outcome.read_text())
    except (OSError, ValueError):
        return {}
    return outcome if isinstance(outcome, dict) else {}


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
    """Another process holds the run directory (a run or a resume of it is under way)."""


@contextmanager
def exclusive(run: RunDir) -> Iterator[None]:
    """Hold the run directory for this process: an advisory lock on `run.lock`, released when
    the process ends however it ends, so a second run or resume of the same directory is
    refused instead of its parties joining the first one's label party."""
    fd = os.open(run.root / "run.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunInUse(f"{run.root} is in use by another splitleak process (pid {holder}): let it "
                       "end, or stop it, before running or resuming it again") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)
