"""The data files a run reads (absolute path, size, modification time): a resume trains on them again."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from pathlib import Path
from typing import get_args

from pydantic import ValidationError

from splitleak.artifacts.manifest import DataFile
from splitleak.config import ExperimentConfig
from splitleak.datasets import DATASETS
from splitleak.datasets.base import DataPath
from splitleak.registry import UnknownPluginError

_DATA_PATH = list(get_args(DataPath)[1:])  # how a dataset's parameter says it names a data file


def data_paths(cfg: ExperimentConfig) -> dict[str, Path]:
    """Each data file the config's dataset parameters name (`dataset.params.<name>`, a folder's
    files as `dataset.params.<name>/<file>`), as an absolute path: a relative one is read
    from the working directory, as the loaders read it."""
    found: dict[str, Path] = {}
    for key, value in _path_params(cfg).items():
        path = Path(os.path.abspath(Path(value).expanduser()))
        if path.is_dir():  # the files the loader reads there (a readme or stray file is none)
            read = _folder_files(cfg)
            found |= {f"{key}/{f.name}": f for f in sorted(path.iterdir())
                      if f.is_file() and (read is None or f.name in read)}
        else:
            found[key] = path
    return found


def _folder_files(cfg: ExperimentConfig) -> tuple[str, ...] | None:
    try:
        return DATASETS.get(cfg.dataset.name).FOLDER_FILES
    except UnknownPluginError:
        return None


def _path_params(cfg: ExperimentConfig) -> dict[str, str]:
    try:
        params_model = DATASETS.get(cfg.dataset.name).Params
        params = params_model.model_validate(cfg.dataset.params)
    except (UnknownPluginError, ValidationError):
        return {}  # the config is refused elsewhere, naming the problem
    named = {name for name, field in params_model.model_fields.items()
             if field.metadata == _DATA_PATH}
    return {f"dataset.params.{name}": value for name in sorted(named)
            if isinstance(value := getattr(params, name), str)}


def data_files(cfg: ExperimentConfig) -> dict[str, DataFile]:
    """What a checkpoint records of the data its run trains on: cheap for any size of file."""
    files = {}
    for key, path in data_paths(cfg).items():
        try:
            stat = path.stat()
        except OSError:
            continue  # the loader says it is missing
        files[key] = DataFile(path=str(path), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
    return files


DIGEST_SPAN = 1 << 20  # bytes read at each end of a file for its digest


def data_digests(cfg: ExperimentConfig) -> dict[str, str]:
    """A digest of each data file `cfg` names, as it is on this host (SHA-256 of its size, its
    first and last MiB: cheap for any size of file, yet another version, sample or order of
    the rows differs); a file that cannot be read is left out (the loader names it)."""
    digests = {}
    for key, path in data_paths(cfg).items():
        try:
            with path.open("rb") as file:
                size = os.fstat(file.fileno()).st_size
                digest = hashlib.sha256(str(size).encode() + b"\0" + file.read(DIGEST_SPAN))
                if size > DIGEST_SPAN:
                    file.seek(max(DIGEST_SPAN, size - DIGEST_SPAN))
                    digest.update(file.read(DIGEST_SPAN))
        except OSError:
            continue
        digests[key] = digest.hexdigest()
    return digests


def data_changes(trained: dict[str, DataFile], cfg: ExperimentConfig) -> list[str]:
    """How the data `cfg` names now differs from the files a run was trained on."""
    now = data_paths(cfg)
    read = _folder_files(cfg)
    changes = []
    for key, then in sorted(trained.items()):
        if read is not None and "/" in key and key.split("/", 1)[1] not in read:
            continue  # a folder's file the loader does not read (recorded by an earlier version)
        path = now.get(key)
        if path is None or str(path) != then.path:
            changes.append(f"{key} now names {path or 'no file'}, not {then.path}")
            continue
        try:
            stat = path.stat()
        except OSError as err:
            changes.append(f"{then.path} cannot be read ({err.strerror or err})")
            continue
        if stat.st_size != then.size:
            changes.append(f"{then.path} holds {stat.st_size} bytes, not {then.size}")
        elif stat.st_mtime_ns != then.mtime_ns:
            changes.append(f"{then.path} was modified at {_when(stat.st_mtime_ns)}, after the "
                           f"run read it (modified at {_when(then.mtime_ns)})")
    return changes


def _when(mtime_ns: int) -> str:
    return dt.datetime.fromtimestamp(mtime_ns / 1e9, dt.UTC).isoformat(timespec="microseconds")


def describe(changes: list[str]) -> str:
    """The sentence a refused resume gives for `changes`."""
    return ("; ".join(changes) + ": the remaining steps would train on other data than the "
            "checkpoint's (a relative path is read from the working directory: resume from the "
            "directory the run was started in, or put the data file back as it was)")

