"""The leak analysis makes one row per logged batch, layer, attack and draw (~100 per train step
by default): ~15 million at a paper-length run's 150,000 steps. It holds a chunk of them, writes
it to attacker/leak.parquet and reads the file back a few groups at a time for the summary."""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attacker.analysis import leak_file
from attacker.analysis.analyze import LEAK_SCHEMA, Attacker, _row, analyze
from attacker.analysis.leak import BatchLeak, LeakAUC
from attacker.analysis.summary import above_bound, summarise_leak
from attacker.attacks import build_attack
from splitleak.artifacts.paths import RunDir
from tests.test_attacks_benchmarks import synthetic_run

ROWS = 5000
HINTS = [("hint_inner", {"k": 1})]  # a cheap attack, run once per draw: many rows per batch
LEAK_ROW_BYTES = 350  # what a LeakRow held (the first test bounds it)


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
    with leak_file.LeakWriter(tmp_path / "leak.parquet") as leak:
        leak.add(rows)
    assert max(built) <= 64 and sum(built) == 1000  # never the whole run's rows at once
    monkeypatch.undo()
    assert pq.read_table(tmp_path / "leak.parquet").equals(pa.Table.from_pylist(rows, schema=LEAK_SCHEMA))
    with leak_file.LeakWriter(tmp_path / "empty.parquet"):
        pass
    assert pq.read_table(tmp_path / "empty.parquet").schema.equals(LEAK_SCHEMA)


def _many_rows(root: Path, steps: int) -> RunDir:
    """A run of `steps` 8-row batches, 100 to an epoch, at the cut and first layer."""
    return synthetic_run(root, 2, 2, [(step // 100, step) for step in range(steps)], rows=8)


def test_the_analysis_holds_a_chunk_of_leak_rows_not_the_run(tmp_path: Path, monkeypatch) -> None:
    """All rows at once (as before) took LEAK_ROW_BYTES a row of traced memory till the end;
    streamed, the analysis' peak is bounded by a chunk of rows and a pass's groups."""
    run = _many_rows(tmp_path / "run", 400)
    analyze(run.root, HINTS, draws=10)  # imports and caches first
    monkeypatch.setattr(leak_file, "LEAK_CHUNK_ROWS", 64)
    monkeypatch.setattr(leak_file, "GROUP_PASS_ROWS", 256)
    tracemalloc.start()
    try:
        analyze(run.root, HINTS, draws=10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rows = pq.read_metadata(run.leak).num_rows
    assert rows == 400 * 2 * 10
    bound = 1_500_000  # ~0.4 MB measured; the run's rows as LeakRows: 2.8 MB more
    assert rows * LEAK_ROW_BYTES > 1.8 * bound
    assert peak < bound, f"{peak / 1e6:.1f} MB traced at the peak for {rows} leak rows"


@pytest.mark.parametrize("pass_rows", [100, 1 << 20])
def test_the_streamed_leak_file_and_summary_equal_the_rows_at_once(tmp_path: Path, monkeypatch,
                                                                   pass_rows: int) -> None:
    """leak.parquet written a chunk at a time is the table of every row at once, and the summary
    read back a few groups per pass (or all in one) is summarise_leak's of that list."""
    run = _many_rows(tmp_path / "run", 250)
    made: list = []
    add = leak_file.LeakWriter.add

    def recording(self, rows):  # type: ignore[no-untyped-def]
        rows = list(rows)
        made.extend(rows)
        return add(self, rows)

    monkeypatch.setattr(leak_file.LeakWriter, "add", recording)
    monkeypatch.setattr(leak_file, "LEAK_CHUNK_ROWS", 64)
    monkeypatch.setattr(leak_file, "GROUP_PASS_ROWS", pass_rows)
    summary = analyze(run.root, [*HINTS, ("norm", {}), ("clustering", {"scope": "epoch"})], draws=3)
    written = pq.ParquetFile(run.leak)
    sizes = [written.metadata.row_group(i).num_rows for i in range(written.num_row_groups)]
    assert len(made) > 64 and max(sizes) == 64 and sum(sizes) == len(made)
    assert written.read().equals(pa.Table.from_pylist(made, schema=LEAK_SCHEMA))
    monkeypatch.undo()
    whole = summarise_leak(made)
    assert {e["scope"] for e in whole} == {"run", "epoch"} and max(e["draws"] for e in whole) == 3
    assert len(summary["leak"]) == len(whole)
    assert json.dumps([{k: e[k] for k in w if k != "threat"} for e, w in zip(summary["leak"], whole,
                                                                               strict=True)]) == \
        json.dumps([{k: v for k, v in w.items() if k != "threat"} for w in whole])


def test_an_analysis_that_fails_midway_leaves_the_last_leak_file(tmp_path: Path, monkeypatch) -> None:
    """Rows are written as they come, into a temporary file renamed at the end: a failure after
    some chunks were written leaves the previous leak.parquet, not part of a new one."""
    from attacker.analysis import analyze as analysis

    run = _many_rows(tmp_path / "run", 50)
    analyze(run.root, HINTS, draws=2)
    before = run.leak.read_bytes()
    evaluate, calls = analysis.evaluate_batch, []

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 150:
            raise RuntimeError("killed mid-way")
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(leak_file, "LEAK_CHUNK_ROWS", 16)
    monkeypatch.setattr(analysis, "evaluate_batch", failing)
    with pytest.raises(RuntimeError, match="mid-way"):
        analyze(run.root, HINTS, draws=2)
    assert run.leak.read_bytes() == before
    assert sorted(p.name for p in run.attacker.iterdir() if "leak" in p.name) == ["leak.parquet"]


def test_a_chunk_of_leak_rows_becomes_the_batch_from_pylist_makes() -> None:
    """The writer reads each LeakRow's slots a column at a time; the batch is the one
    RecordBatch.from_pylist makes of the same rows (LeakRows, or dicts lacking keys)."""
    import numpy as np
    import pyarrow as pa

    from attacker.analysis.leak_file import LEAK_SCHEMA, LeakRow, _batch

    rows = [LeakRow(party_id=k % 3, layer="cut" if k % 2 else "first", epoch=k // 10, step=k,
                    attack="norm", name="norm", side_knowledge="none", metric="auc",
                    auc_raw=None if k % 5 == 0 else k / 7, auc_flipped=np.float64(k / 9),
                    n_rows=np.int64(32), skip_reason="tied" if k % 4 == 0 else None, draw=k % 2)
            for k in range(40)]
    assert _batch(rows).equals(pa.RecordBatch.from_pylist(rows, schema=LEAK_SCHEMA))
    dicts = [dict(row) for row in rows[:5]] + [{"party_id": 1, "step": 3, "attack": "norm"}]
    assert _batch(dicts).equals(pa.RecordBatch.from_pylist(dicts, schema=LEAK_SCHEMA))
