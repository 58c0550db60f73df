"""Run artifacts: the tiny sweep's trade-off table stays byte for byte what it was (every
number the project computes), and the typed artifacts read back what their writers wrote."""

from __future__ import annotations

import contextlib
import csv
import io
from pathlib import Path

from orchestration.cli import main

REFERENCE_TABLE = Path(__file__).parent / "data" / "tiny_sweep_table.csv"


def without_setting_keys(table: str) -> str:
    """The table with its `setting_key` column blanked: the key hashes the resolved config,
    which names the (temporary) directory the sweep ran in."""
    rows = list(csv.reader(io.StringIO(table)))
    column = rows[0].index("setting_key")
    for row in rows[1:]:
        table = table.replace(f'"{row[column]}"', '""')
    return table


def test_the_tiny_sweep_table_is_the_reference(inprocess_sweep: tuple[Path, str],
                                               tmp_path: Path) -> None:
    sweep_dir, _ = inprocess_sweep
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["compare", str(sweep_dir), "--output-dir", str(tmp_path)]) == 0
    table = (tmp_path / "table.csv").read_text()
    assert without_setting_keys(table) == without_setting_keys(REFERENCE_TABLE.read_text())
