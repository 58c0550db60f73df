"""Coordinated checkpoints (DESIGN.md §9): the files, the manifest written last, the resume point.

    RUN/checkpoints/step-00000120-batch-00000131/
        passive_party_1.pt   one per passive party (written by that party, in its run directory)
        label_party.pt       the label party's trainer state (after every party acknowledged)
        manifest.json        written last, by the label party: the checkpoint is complete

A checkpoint at `Position(step, batches)` holds every party's state after train steps
0..step-1 and the first `batches` batches of the schedule (evaluations included). The sidecar
writes no file: its checkpoint is the record count at that step, in the manifest.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from splitleak.artifacts.gradient_shards import records_before
from splitleak.artifacts.manifest import Manifest as Manifest
from splitleak.artifacts.manifest import ManifestError
from splitleak.artifacts.manifest import Position as Position
from splitleak.artifacts.manifest import read_manifest as read_manifest_file
from splitleak.artifacts.outcome import read_outcome_model
from splitleak.artifacts.paths import CHECKPOINT_FOLDER, RunDir
from splitleak.artifacts.paths import CHECKPOINT_LABEL_PARTY as LABEL_PARTY_FILE
from splitleak.artifacts.paths import CHECKPOINT_MANIFEST as MANIFEST
from splitleak.artifacts.rundir import LinkedRunDir, refuse_symlinks
from splitleak.config import ConfigError, ExperimentConfig, differences, load_config
from splitleak.fileio import sha256_file, write_atomically

KEEP = 2  # complete checkpoints kept on disk: the newest, and the one before in case it is torn
log = logging.getLogger("splitleak")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, incomplete, altered, or of another run."""


class DataChanged(CheckpointError):
    """The checkpoint is whole, but the data files the config names now are not the ones its run
    trained on: the run must not go on, nor start over (that would discard the checkpoint)."""


def step_dir(run_root: Path, position: Position) -> Path:
    return RunDir(run_root).checkpoint(position.step, position.batches)


def save_torch(path: Path, state: dict[str, Any]) -> None:
    """torch.save, atomically, through a Python file: a full disk is then an OSError naming
    the file (ENOSPC), not torch's own "enforce fail ... unexpected pos" RuntimeError."""
    def write(tmp: Path) -> None:
        with tmp.open("wb") as out:
            try:
                torch.save(state, out)
            except RuntimeError as err:
                # The file's write failed inside torch's zip writer, whose exit then raised
                # "unexpected pos" over it: the OSError is the reason.
                if isinstance(err.__context__, OSError):
                    raise err.__context__ from None
                raise

    try:
        write_atomically(path, write)
    except OSError as err:
        if err.filename is not None:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from None


def save_state(path: Path, state: dict[str, Any]) -> str:
    """Write a state dict atomically; returns its SHA-256."""
    save_torch(path, state)
    return sha256_file(path)


def load_state(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """Read a state dict written by `save_state`, checking its SHA-256 when given."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    if sha256 is not None and sha256_file(path) != sha256:
        raise CheckpointError(f"checkpoint file {path} does not match the manifest's SHA-256 "
                              "(changed or torn since it was written)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same problem for a user
        raise CheckpointError(f"checkpoint file {path} cannot be read: {err}") from None


def read_manifest(path: Path) -> Manifest:
    try:
        return read_manifest_file(path)
    except ManifestError as err:
        raise CheckpointError(str(err)) from None


def _step_dirs(run_root: Path) -> list[tuple[Position, Path]]:
    """Every checkpoint directory, in schedule order."""
    base = RunDir(run_root).checkpoints
    if not base.is_dir():
        return []
    found = [(Position(int(m.group(1)), int(m.group(2))), p) for p in base.iterdir()
             if p.is_dir() and (m := CHECKPOINT_FOLDER.fullmatch(p.name))]
    return sorted(found, key=lambda item: item[0].batches)


def complete_manifests(run_root: Path) -> list[Manifest]:
    """Every readable manifest, oldest first (a step directory without one is incomplete)."""
    found = []
    for _, directory in _step_dirs(run_root):
        if (directory / MANIFEST).is_file():
            try:
                found.append(read_manifest(directory / MANIFEST))
            except CheckpointError:
                continue
    return found


def check_files(run_root: Path, manifest: Manifest, every_party: bool = False) -> str | None:
    """Why a complete checkpoint cannot be resumed from (None: it can): a file it names is
    missing, torn or changed. The label party's own file must be there; a passive party's file
    is checked where this run directory holds it (a party on another host checks its own),
    and with `every_party` (every party's run directory is this one) it must be there too."""
    directory = step_dir(run_root, manifest.position)
    for name, sha256 in sorted(manifest.files.items()):
        path = directory / name
        if not path.exists() and name != LABEL_PARTY_FILE and not every_party:
            continue
        if not path.is_file():
            return f"{path} is {'not a regular file' if path.exists() else 'missing'}"
        if sha256_file(path) != sha256:
            return f"{path} does not match the manifest's SHA-256 (torn or changed since it was written)"
    return None


def check_log(run_root: Path, manifest: Manifest) -> str | None:
    """Why the sidecar's gradient log cannot continue from a checkpoint (None: it can): a
    party's log holds fewer records of the steps before it than the manifest counts (a shard
    cut short or removed; resuming would leave those steps out of the log for good). A log
    that is not in this run directory (a sidecar on another host) is not checked here."""
    gradients = RunDir(run_root).gradients
    if not gradients.is_dir():
        return None
    for party, expected in sorted(manifest.recorded.items()):
        folder = gradients / f"party_{party}"
        held, shard = records_before(folder, manifest.step)
        if held < expected:
            where = (f"the count ends in {shard}" if shard is not None
                     else f"{folder} holds no shard")
            return (f"party {party}'s gradient log holds {held} record(s) of the steps before "
                    f"{manifest.step} ({where}) but the checkpoint counts {expected}")
    return None


def missing_log(run_root: Path, manifest: Manifest | None) -> str | None:
    """Why a run whose sidecar logs into its run directory (`splitleak run`) cannot resume from
    `manifest` (None: it can): the checkpoint counts records of a log that is gone altogether
    (`check_log` passes over a log that is elsewhere)."""
    gradients = RunDir(run_root).gradients
    if manifest is None or not manifest.recorded or gradients.is_dir():
        return None
    counts = ", ".join(f"{n} of party {k}" for k, n in sorted(manifest.recorded.items()))
    return (f"the checkpoint of step {manifest.step} counts gradient records ({counts}), but the "
            f"run's gradient log {gradients} is gone: a resume would leave those steps out of it "
            "for good (put the log back, or remove the checkpoints directory to start the run "
            "again from step 0)")


def resumable(run_root: Path, every_party: bool = False, warn: bool = True) -> Manifest | None:
    """The newest complete checkpoint whose files are whole and whose gradient log records the
    sidecar still holds (None: there is none, resume at step 0); an older one when the newest
    is torn, its manifest unreadable or the log short of it (the reason two are kept), or,
    with `every_party` (check_files), a party's file gone from it, which `warn` logs.
    CheckpointError when there are checkpoints but none is whole."""
    unusable: list[str] = []
    for position, directory in reversed(_step_dirs(run_root)):
        if not (directory / MANIFEST).exists():
            continue  # incomplete: a kill came before its manifest was written
        try:
            manifest = read_manifest(directory / MANIFEST)
        except CheckpointError as err:
            problem: str | None = str(err)
        else:
            problem = (check_files(run_root, manifest, every_party)
                       or check_log(run_root, manifest))
        if problem is None:
            if unusable and warn:
                log.warning("resuming from the checkpoint of step %d: %s", manifest.step,
                            "; ".join(unusable))
            return manifest
        unusable.append(f"the checkpoint of step {position.step} is unusable: {problem}")
    if unusable:
        raise CheckpointError("; ".join(unusable) + " (remove the checkpoints directory to "
                              "start the run again from step 0)")
    return None


def discard_after(run_root: Path, position: Position | None) -> None:
    """Remove the checkpoints after the one a resume starts from (all, from step 0): the
    resumed run redoes their steps, and a torn one must not be mistaken for the newest."""
    for at, directory in _step_dirs(run_root):
        if position is None or at.batches > position.batches:
            shutil.rmtree(directory, ignore_errors=True)


def latest(run_root: Path) -> Manifest | None:
    """The newest complete checkpoint of a run, or None (resume then starts at step 0)."""
    manifests = complete_manifests(run_root)
    return manifests[-1] if manifests else None


def newest_fields(run_root: Path) -> dict[str, Any]:
    """What an outcome of a run that did not finish says of its newest complete checkpoint, the
    one `--resume` goes on from: `checkpoint` (its directory's name) and `checkpoint_step`, both
    None when there is none."""
    newest = latest(run_root)
    return {"checkpoint": step_dir(run_root, newest.position).name if newest else None,
            "checkpoint_step": newest.step if newest else None}


def prune(run_root: Path, keep: int = KEEP) -> None:
    """Keep the newest `keep` complete checkpoints; remove older and abandoned directories."""
    complete = [m.batches for m in complete_manifests(run_root)]
    if not complete:
        return
    oldest_kept = complete[-keep:][0]
    for position, directory in _step_dirs(run_root):
        at = position.batches
        if at < oldest_kept or (at < complete[-1] and at not in complete):
            shutil.rmtree(directory, ignore_errors=True)


def prune_own(run_root: Path, file_name: str, keep: int = KEEP) -> None:
    """A party that writes into its own run directory keeps its `keep` newest checkpoint files
    (the label party's newest complete manifest always names one of them: it asks for a new
    checkpoint only after writing the manifest of the previous one)."""
    mine = [d / file_name for _, d in _step_dirs(run_root) if (d / file_name).exists()]
    for path in mine[:-keep]:
        path.unlink(missing_ok=True)
        try:
            path.parent.rmdir()  # only if nothing else is left in it
        except OSError:
            pass


# Where a run lives is not part of what it computes: a run started with --output-dir resumes
# with its own experiment file (whose output_dir names another place) all the same.
WHERE_IT_LIVES = ("run.output_dir",)


def config_conflicts(reference: dict[str, Any], cfg: ExperimentConfig) -> list[str]:
    """What `cfg` changes against the config a run was started (and checkpointed) with. Both
    are compared resolved; a run from before [evaluation] existed is compared without it."""
    from splitleak.validation import resolved

    current = resolved(cfg).model_dump(mode="json")
    if "evaluation" not in reference:
        current.pop("evaluation")
    return [change for change in differences(reference, current)
            if change.split(":", 1)[0] not in WHERE_IT_LIVES]


def resume_point(run_root: Path, cfg: ExperimentConfig, data: bool = True,
                 trained: bool = False, every_party: bool = False,
                 warn: bool = True) -> Manifest | None:
    """The checkpoint a resume of `run_root` with `cfg` starts from (None: step 0), after
    checking that `cfg` is the config the run was started with and, with `data`, that it names
    the data files the checkpoint's run trained on (DataChanged: not). `trained`: a run whose
    outcome says ok may be resumed too (a sweep point stopped after its training, before its
    processes were collected). `every_party`: every party keeps its checkpoints in `run_root`
    (`splitleak run`, a sweep point), so one whose party file is gone is passed over too; the
    caller then discards the checkpoints after the one returned (discard_after, holding the
    run's lock) before the label party, which cannot tell, starts. `warn`: log why newer
    checkpoints are passed over (off for a check before the run's lock is held, which the
    resume itself repeats)."""
    config = RunDir(run_root).config
    if not config.is_file():
        raise CheckpointError(f"{run_root} is not a run directory (it has no {config.name})")
    try:
        refuse_symlinks(run_root)  # a resume cuts files back: never one outside the run
    except LinkedRunDir as err:
        raise CheckpointError(str(err)) from None
    if not trained and _outcome_status(run_root) == "ok":
        raise CheckpointError(f"{run_root} finished ({RunDir(run_root).outcome.relative_to(run_root)} says "
                              "ok); "
                              "there is nothing to resume")
    manifest = resumable(run_root, every_party, warn)
    if manifest is not None:
        reference = manifest.config
    else:
        try:
            reference = load_config(config).model_dump(mode="json")
        except ConfigError as err:
            raise CheckpointError(f"the run's own config cannot be read: {err}") from None
    conflicts = config_conflicts(reference, cfg)
    if conflicts:
        shown = "; ".join(conflicts[:8]) + (f"; and {len(conflicts) - 8} more" if len(conflicts) > 8
                                            else "")
        raise CheckpointError(f"cannot resume {run_root} with a different config; it changes "
                              f"{shown}")
    if manifest is not None and data:
        check_data(run_root, manifest, cfg)
    return manifest


def check_data(run_root: Path, manifest: Manifest, cfg: ExperimentConfig) -> None:
    """DataChanged unless `cfg` names the data files the checkpoint's run trained on, as they
    were (the same absolute path, size and modification time)."""
    from splitleak.data_files import data_changes, describe

    changes = data_changes(manifest.data, cfg)
    if changes:
        raise DataChanged(f"cannot resume {run_root} from the checkpoint of step "
                              f"{manifest.step}: {describe(changes)}")


def _outcome_status(run_root: Path) -> str | None:
    outcome = read_outcome_model(RunDir(run_root))
    return outcome.status if outcome is not None else None


def rng_state() -> dict[str, Any]:
    """The process-wide torch RNG (plug-ins should use their own generators; this is the net)."""
    state: dict[str, Any] = {"torch": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.random.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
