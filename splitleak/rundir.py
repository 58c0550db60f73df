"""The run directory layout (DESIGN.md §6), in one place."""

from __future__ import annotations

import datetime as dt
import platform
from dataclasses import dataclass
from pathlib import Path

import grpc
import torch

from splitleak.config import ExperimentConfig


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
