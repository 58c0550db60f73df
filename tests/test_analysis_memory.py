"""The leak analysis holds one row per logged batch, layer, attack and draw (~100 per train step
by default) until it writes attacker/leak.parquet: at a paper-length run's 150,000 steps that is
~15 million rows, so what one row costs bounds the analysis' memory."""

from __future__ import annotations

import tracemalloc
from dataclasses import fields
from pathlib import Path

import pyarrow as pa

from attacker.analysis.analyze import LEAK_SCHEMA, Attacker, _row
from attacker.analysis.leak import BatchLeak, LeakAUC
from attacker.analysis.summary import above_bound, summarise_leak
from attacker.attacks import build_attack

ROWS = 5000


def _rows(n: int) -> list:
    unit, attack = Attacker((1,), 0), build_attack("norm", {})
    return [_row(unit, "cut", step // 100, 1000 + step, attack,
                 BatchLeak(attack.label, "auc", 16, 0,
                           auc=LeakAUC(0.2 + step * 1e-6, 0.8 + step * 1e-6, 16, 5),
                           threshold_accuracy=0.5 + step * 1e-6), step % 5)
            for step in range(n)]


def test_a_leak_row_costs_a_bounded_few_hundred_bytes_not_a_dict() -> None:
    _rows(10)  # imports and caches first
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rows = _rows(ROWS)
        per_row = (tracemalloc.get_traced_memory()[0] - before) / ROWS
    finally:
        tracemalloc.stop()
    assert len(rows) == ROWS
    assert not hasattr(rows[0], "__dict__")
    # a 26-key dict with its three float objects held ~940 bytes; the slotted row ~350
    assert per_row < 500, f"{per_row:.0f} bytes per leak row"


def test_a_leak_row_reads_like_the_dict_it_replaces() -> None:
    row = _rows(1)[0]
    as_dict = dict(row)
    assert list(as_dict) == LEAK_SCHEMA.names and row == as_dict
    assert row["step"] == 1000 and row.get("anchor") is None and row.get("absent", 3) == 3
    assert "draw" in row and "absent" not in row and len(row) == len(LEAK_SCHEMA.names)
    assert pa.Table.from_pylist([row], schema=LEAK_SCHEMA).to_pylist() == [as_dict]
    rows = _rows(10)
    assert summarise_leak(rows) == summarise_leak([dict(r) for r in rows])
    assert above_bound(rows, {1: {1000 + s: 0.5 for s in range(10)}}) == \
        above_bound([dict(r) for r in rows], {1: {1000 + s: 0.5 for s in range(10)}})
    from attacker.analysis.analyze import LeakRow

    assert [f.name for f in fields(LeakRow)] == LEAK_SCHEMA.names  # one field per column, in order
    try:
        LeakRow(stepp=1)
    except TypeError as err:
        assert "stepp" in str(err)
    else:
        raise AssertionError("an unknown column was accepted")


def test_leak_parquet_is_written_a_bounded_chunk_of_rows_at_a_time(tmp_path, monkeypatch) -> None:
    import pyarrow.parquet as pq

    from attacker.analysis import leak_file

    built: list[int] = []
    write_batch = pq.ParquetWriter.write_batch

    def recording(self, batch, *args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(batch.num_rows)
        return write_batch(self, batch, *args, **kwargs)

    monkeypatch.setattr(leak_file, "LEAK_CHUNK_ROWS", 64)
    monkeypatch.setattr(pq.ParquetWriter, "write_batch", recording)
    rows = _rows(1000)
    leak_file.write_leak(tmp_path / "leak.parquet", rows)
    assert max(built) <= 64 and sum(built) == 1000  # never the whole run's rows at once
    monkeypatch.undo()
    assert pq.read_table(tmp_path / "leak.parquet").equals(pa.Table.from_pylist(rows, schema=LEAK_SCHEMA))
    leak_file.write_leak(tmp_path / "empty.parquet", [])
    assert pq.read_table(tmp_path / "empty.parquet").schema.equals(LEAK_SCHEMA)


def test_the_report_reads_only_the_leak_columns_it_uses(tmp_path: Path) -> None:
    """The report read all 26 columns of leak.parquet (~1 KB a row in memory, ~100 rows per
    train step): a long run's report needed many GB on top of the analysis."""
    import pyarrow.parquet as pq

    from attacker.report.report import _LEAK_READ, _read_leak

    path = tmp_path / "leak.parquet"
    pq.write_table(LEAK_SCHEMA.empty_table(), path)
    read = _read_leak(path)
    assert read.column_names == [n for n in LEAK_SCHEMA.names if n in _LEAK_READ]
    assert len(read.column_names) == len(_LEAK_READ) < len(LEAK_SCHEMA.names) / 2
    assert isinstance(read, pa.Table)
