"""A sweep's index (sweep.parquet: one row per point) and each point's result
(sweep_point.json in its run directory): their models, writers and readers."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from splitleak.artifacts.artifact import first_error
from splitleak.artifacts.paths import RunDir, SweepDir
from splitleak.fileio import write_atomically

# pending: not started; running: started by an engine (left over if the driver was killed);
# done: trained and analysed; failed: the run or its analysis failed (message says why);
# interrupted: stopped by Ctrl-C. Only `done` (and `failed`, unless retried) is skipped on a re-run.
STATUSES = ("pending", "running", "done", "failed", "interrupted")
Status = Literal["done", "failed", "interrupted"]

# overrides: every override of the base (JSON, path -> value, in the order applied); axes: the
# axis values that tell the point's setting apart (JSON, path as the sweep file wrote it ->
# value, the seed left out): what the comparison reads back as the setting's identity.
SCHEMA = pa.schema([
    ("point", pa.int32()), ("hash", pa.string()), ("label", pa.string()),
    ("setting", pa.string()), ("variant", pa.string()), ("seed", pa.int64()),
    ("overrides", pa.string()), ("axes", pa.string()), ("status", pa.string()),
    ("run_dir", pa.string()), ("seconds", pa.float64()), ("message", pa.string()),
    ("engine", pa.string()), ("nodes", pa.string()), ("updated", pa.string()),
])
ADDED_LATER = ("axes",)  # columns an index written by an earlier version lacks (read as null)


class SweepIndexRow(BaseModel):
    """One point of sweep.parquet (SCHEMA's columns)."""

    point: int
    hash: str
    label: str
    setting: str
    variant: str
    seed: int
    overrides: str | None
    axes: str | None = None
    status: str
    run_dir: str
    seconds: float | None
    message: str | None
    engine: str | None
    nodes: str | None
    updated: str | None

    def axes_dict(self) -> dict[str, Any] | None:
        return json.loads(self.axes) if self.axes is not None else None

    def overrides_dict(self) -> dict[str, Any]:
        return json.loads(self.overrides or "{}")


class SweepIndexError(ValueError):
    """An index file that cannot be read; the message names the file."""


def read_index_rows(sweep_dir: Path) -> list[SweepIndexRow]:
    """The sweep's index ([] when it has none)."""
    path = SweepDir(sweep_dir).index
    if not path.exists():
        return []
    try:
        # One open file: the writer replaces the index by a rename, and a path read may take
        # the size of one version and the bytes of the next (pyarrow stats, then reopens).
        with path.open("rb") as source:
            table = pq.read_table(pa.BufferReader(source.read()))
    except (pa.ArrowInvalid, OSError) as err:
        raise SweepIndexError(f"{path} is not a readable sweep index ({err}); move it away to start "
                          "the sweep's bookkeeping afresh (finished run directories are kept)") from None
    missing = sorted(set(SCHEMA.names) - set(table.column_names) - set(ADDED_LATER))
    if missing:
        raise SweepIndexError(f"{path} lacks the columns {missing}: not a sweep index of this version")
    return [_index_row(path, number, row) for number, row in enumerate(table.to_pylist())]


def _index_row(path: Path, number: int, row: dict[str, Any]) -> SweepIndexRow:
    """Row `number` (from 0) of the index; SweepIndexError naming the file, row and field."""
    try:
        return SweepIndexRow.model_validate(row)
    except ValidationError as err:
        raise SweepIndexError(f"{path} row {number}: {first_error(err)}; move the index away to "
                              "start the sweep's bookkeeping afresh (finished run directories "
                              "are kept)") from None


def write_index_rows(sweep_dir: Path, rows: list[dict[str, Any]]) -> None:
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    write_atomically(SweepDir(sweep_dir).index, lambda tmp: pq.write_table(table, tmp))


@dataclass(frozen=True)
class PointResult:
    status: Status
    seconds: float  # wall time of the point as its engine saw it (start-up and analysis included)
    message: str | None = None  # why it failed
    nodes: dict[str, Any] | None = None  # where each role ran (engines that place roles)


def write_result(run_dir: Path, result: PointResult) -> None:
    text = json.dumps(asdict(result), indent=2)
    write_atomically(RunDir(run_dir).point_result, lambda tmp: tmp.write_text(text))


def read_result(run_dir: Path) -> PointResult | None:
    try:
        return TypeAdapter(PointResult).validate_json(RunDir(run_dir).point_result.read_bytes())
    except (OSError, ValidationError):
        return None


class DataPaths(BaseModel):
    """data_paths.json: the working directory a sweep last ran from and, per point hash, the
    absolute data file each of its config's data paths named there."""

    working_directory: str
    points: dict[str, dict[str, str]]


def read_data_paths(sweep_dir: Path) -> DataPaths | None:
    """None: no record (a sweep of an earlier version, or none yet) or one that cannot be read."""
    try:
        return DataPaths.model_validate_json(SweepDir(sweep_dir).data_paths.read_bytes())
    except (OSError, ValidationError):
        return None


def write_data_paths(sweep_dir: Path, record: DataPaths) -> None:
    text = json.dumps(record.model_dump(), indent=1, sort_keys=True) + "\n"
    write_atomically(SweepDir(sweep_dir).data_paths, lambda tmp: tmp.write_text(text))
