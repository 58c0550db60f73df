"""The run and sweep directory layouts (DESIGN.md §6): every path, in one place."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "config.toml"
TIMING_FILE = "timing.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_MANIFEST = "manifest.json"  # in each checkpoint's folder (splitleak.checkpoint)
CHECKPOINT_LABEL_PARTY = "label_party.pt"  # the label party's state, in each checkpoint's folder
CHECKPOINT_FOLDER = re.compile(r"step-(\d+)-batch-(\d+)")  # RunDir.checkpoint's names
GRADIENT_LOG_INDEX = "index.json"  # in the gradient log's folder (attacker/gradients/)
SWEEP_INDEX_FILE = "sweep.parquet"
SWEEP_FILE = "sweep.toml"
POINT_RESULT_FILE = "sweep_point.json"  # a sweep point's result, in its run directory
COMPARE_DIR = "compare"


def checkpoint_party_file(party_id: int) -> str:
    """A passive party's state file in a checkpoint's folder."""
    return f"passive_party_{party_id}.pt"


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

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

    @property
    def label_timing(self) -> Path:
        return self.label_party / TIMING_FILE

    def passive_party(self, party_id: int) -> Path:
        return self.root / f"passive_party_{party_id}"

    def passive_party_ids(self) -> list[int]:
        """The passive parties that have a folder here, in order."""
        found = (p.name.removeprefix("passive_party_") for p in self.root.glob("passive_party_*"))
        return sorted(int(k) for k in found if k.isdigit())

    def passive_timing(self, party_id: int) -> Path:
        return self.passive_party(party_id) / TIMING_FILE

    def bottom_model(self, party_id: int) -> Path:
        return self.passive_party(party_id) / "bottom.pt"

    def bottom_white_box(self, party_id: int) -> Path:
        """Evaluation-only snapshots of a victim's bottom and its gradients per step (CAFE's
        threat model, splitleak.white_box)."""
        return self.passive_party(party_id) / "white_box"

    def protection(self, party_id: int) -> Path:
        """What a protecting party did to its train images ([protection]), for the report."""
        return self.passive_party(party_id) / "protection.json"

    def tap(self, party_id: int) -> Path:
        """What passive party k's tap on its own traffic saw (splitleak.tap)."""
        return self.passive_party(party_id) / "tap.json"

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
    def pids(self) -> Path:
        """The process ids of a distributed run's roles (the orchestrator's)."""
        return self.root / "pids.json"

    @property
    def lock(self) -> Path:
        return self.root / "run.lock"

    @property
    def serving_lock(self) -> Path:
        """Held by the label party serving the run (beside the orchestrator's run.lock)."""
        return self.label_party / "serve.lock"

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    def checkpoint(self, step: int, batches: int) -> Path:
        """The folder of the checkpoint after `step` train steps and `batches` schedule batches."""
        return self.checkpoints / f"step-{step:08d}-batch-{batches:08d}"

    @property
    def attacker(self) -> Path:
        return self.root / "attacker"

    @property
    def attacker_timing(self) -> Path:
        return self.attacker / TIMING_FILE

    @property
    def gradients(self) -> Path:
        """The sidecar's log of the gradients it saw (attacker.sidecar.store)."""
        return self.attacker / "gradients"

    @property
    def received(self) -> Path:
        """The sidecar's log of the activations the label party received from its victims
        ([threat.receiver]), laid out as the gradient log."""
        return self.attacker / "received"

    @property
    def leak(self) -> Path:
        """The per-batch leak rows of `attacker analyze`."""
        return self.attacker / "leak.parquet"

    @property
    def leak_rows(self) -> Path:
        """A sample of per-row attack scores of `attacker analyze`."""
        return self.attacker / "rows.parquet"

    @property
    def reconstruction(self) -> Path:
        """The image reconstructions' grid examples (`<attack>_party<k>.npz`) for report.md."""
        return self.attacker / "reconstruction"

    def reconstruction_grid(self, attack: str, party: int) -> Path:
        return self.reconstruction / f"{attack}_party{party}.npz"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def report_md(self) -> Path:
        return self.report / "report.md"

    @property
    def leak_summary(self) -> Path:
        """report/summary.json: the run-level leak entries (splitleak.artifacts.summary)."""
        return self.report / "summary.json"

    @property
    def summary(self) -> Path:
        """summary.json: how the run trained (splitleak.artifacts.summary.TrainingSummary)."""
        return self.root / "summary.json"

    @property
    def point_result(self) -> Path:
        return self.root / POINT_RESULT_FILE

    @property
    def ray(self) -> Path:
        """Where the Ray engine placed the point's roles."""
        return self.root / "ray.json"


def is_run_dir(path: Path) -> bool:
    return (path / CONFIG_FILE).exists()


@dataclass(frozen=True)
class SweepDir:
    root: Path

    @property
    def index(self) -> Path:
        return self.root / SWEEP_INDEX_FILE

    @property
    def sweep_file(self) -> Path:
        """The sweep file as given, copied in."""
        return self.root / SWEEP_FILE

    @property
    def compare(self) -> Path:
        return self.root / COMPARE_DIR

    @property
    def lock(self) -> Path:
        """Held by the `splitleak sweep` process running the sweep (an advisory lock)."""
        return self.root / "sweep.lock"

    @property
    def data_paths(self) -> Path:
        """data_paths.json: the working directory the sweep ran from and the absolute data
        files each point's config named there (orchestration.sweep.workdir)."""
        return self.root / "data_paths.json"

    def point(self, run_dir: str) -> RunDir:
        """A point's run directory, by the name the index gives it."""
        return RunDir(self.root / run_dir)


def is_sweep_dir(path: Path) -> bool:
    return SweepDir(path).index.exists()


@dataclass(frozen=True)
class CompareDir:
    """What `splitleak compare` writes."""

    root: Path

    @property
    def table_parquet(self) -> Path:
        return self.root / "table.parquet"

    @property
    def table_csv(self) -> Path:
        return self.root / "table.csv"

    @property
    def report(self) -> Path:
        return self.root / "report.md"


def timing_file(role: Path) -> Path:
    """A role's timing.json, in its folder of the run directory."""
    return role / TIMING_FILE
