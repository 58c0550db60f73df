"""The report reads attacker/leak.parquet a row group at a time (a long run has ~100 leak rows per
train step): its plots' per-step means and its skip counts are the whole-table ones, float for float."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from attacker.analysis import leak_file
from attacker.analysis.leak_file import LeakWriter, parquet_batches
from attacker.analysis.summary import leak_figures
from attacker.report import plots
from attacker.report.leak_read import leak_lines, skip_counts
from splitleak.artifacts.paths import RunDir

ATTACKS = {"norm": ("auc", 1), "hint_inner(k=1)": ("auc", 3), "hint_inner(k=2)": ("auc", 3),
           "clustering": ("accuracy", 2), "batch_label_counts": ("count_error", 1)}
WHO = [(1, "1"), (2, "2"), (1, "1+2"), (2, None)]  # (party_id, parties): colluding; an old row
REASONS = ["single class in batch (all 0)", "degenerate: every score tied",
           *(f"no positive left after excluding {n} side-knowledge row(s)" for n in range(30))]


def _rows(steps: int) -> list[dict[str, Any]]:
    """Rows in the analysis' order (step, layer, attack, draw), values of very different sizes
    (so the order they are added in shows), some skipped, NaN AUCs at step 7."""
    rng = np.random.default_rng(3)
    rows = []
    for step in range(steps):
        for party_id, parties in WHO:
            for layer in ("cut", "first"):
                for attack, (metric, draws) in ATTACKS.items():
                    for draw in range(draws):
                        skipped = rng.random() < 0.3
                        value = None if skipped else float(rng.random() * 10.0 ** rng.integers(-9, 1))
                        if step == 7 and attack == "norm" and not skipped:
                            value = float("nan")  # a NaN AUC makes its step's mean NaN
                        rows.append({
                            "party_id": party_id, "parties": parties, "layer": layer, "epoch": step // 10,
                            "step": step, "attack": attack, "name": attack.split("(")[0],
                            "side_knowledge": "none", "metric": metric, "draw": draw, "seed": 5,
                            "auc_raw": value, "auc_flipped": value if metric == "auc" else None,
                            "accuracy": value if metric == "accuracy" else None,
                            "count_error": value if metric == "count_error" else None,
                            "skip_reason": REASONS[int(rng.integers(0, len(REASONS) - (layer == "cut")))]
                            if skipped else None})
    return rows


@pytest.fixture
def leak_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """leak.parquet in row groups of 64 rows: a step's rows straddle them."""
    monkeypatch.setattr(leak_file, "LEAK_CHUNK_ROWS", 64)
    path = tmp_path / "leak.parquet"
    with LeakWriter(path) as writer:
        writer.add(_rows(40))
    assert pq.ParquetFile(path).num_row_groups == 50  # 3,200 rows
    return path


def _whole_table_lines(path: Path, party: int, layer: str) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """What the report drew before: the whole table's rows, a grouped mean per attack."""
    leak = pq.read_table(path)
    rows = leak.filter(pc.and_(pc.equal(leak["party_id"], party), pc.equal(leak["layer"], layer)))
    lines = []
    for attack in dict.fromkeys(rows["attack"].to_pylist()):
        one = rows.filter(pc.equal(rows["attack"], attack))
        metric = one["metric"][0].as_py()
        column = "auc_flipped" if metric == "auc" else metric
        one = one.group_by("step", use_threads=False).aggregate([(column, "mean")]).sort_by("step")
        lines.append((attack, metric, one["step"].to_numpy(),
                      one[f"{column}_mean"].to_numpy(zero_copy_only=False).astype(float)))
    return lines


def _whole_table_skips(path: Path, who: str, layer: str) -> list[tuple[str, int]]:
    """The whole table's skipped rows counted by reason, in the order the reasons first appear."""
    counts: dict[str, int] = {}
    for row in pq.read_table(path).to_pylist():
        whose = row.get("parties") or str(row["party_id"])
        if whose == who and row["layer"] == layer and row["skip_reason"] is not None:
            counts[row["skip_reason"]] = counts.get(row["skip_reason"], 0) + 1
    return list(counts.items())


def _grouped_order(path: Path, who: str, layer: str) -> list[str]:
    """The reasons in the order report.md listed them before: the whole table's grouped aggregate."""
    leak = pq.read_table(path)
    mine = pc.equal(pc.coalesce(leak["parties"], pc.cast(leak["party_id"], pa.string())), who)
    skipped = leak.filter(pc.and_(mine, pc.equal(leak["layer"], layer)))
    skipped = skipped.filter(pc.is_valid(skipped["skip_reason"]))
    return skipped.group_by("skip_reason", use_threads=False).aggregate([("step", "count")])[
        "skip_reason"].to_pylist()


@pytest.mark.parametrize(("party", "layer"), [(1, "cut"), (1, "first"), (2, "cut")])
def test_the_plotted_means_are_the_whole_tables_float_for_float(leak_path: Path, party: int,
                                                                layer: str) -> None:
    streamed = leak_lines(leak_path, party, layer)
    whole = _whole_table_lines(leak_path, party, layer)
    assert [(s.attack, s.metric) for s in streamed] == [(a, m) for a, m, *_ in whole]
    assert [line.attack for line in streamed] == list(ATTACKS)
    for line, (_, _, steps, values) in zip(streamed, whole, strict=True):
        assert line.steps.dtype == steps.dtype and line.steps.tobytes() == steps.tobytes()
        assert line.values.dtype == values.dtype and line.values.tobytes() == values.tobytes()
    assert any(np.isnan(line.values).any() for line in streamed)  # all draws skipped: no point
    # summed in another order (reversed, pairwise as np.mean does) some means differ in the last bits
    rows = pq.read_table(leak_path).filter(pc.equal(pc.field("party_id"), party) & pc.equal(
        pc.field("layer"), layer) & pc.equal(pc.field("attack"), "hint_inner(k=1)"))
    pairwise = [np.mean(rows.filter(pc.equal(rows["step"], s))["auc_flipped"].drop_null().to_numpy()
                        [::-1]) for s in range(40)]
    assert np.asarray(pairwise).tobytes() != streamed[1].values.tobytes()


def test_the_plot_draws_the_streamed_means(leak_path: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[tuple[np.ndarray, np.ndarray, str]] = []
    draw = plots._leak_line

    def recording(ax, steps, values, style, label):  # type: ignore[no-untyped-def]
        drawn.append((steps, values, label))
        return draw(ax, steps, values, style, label)

    monkeypatch.setattr(plots, "_leak_line", recording)
    lines = leak_lines(leak_path, 1, "cut")
    plots.leak_over_training(lines, 1, "cut", 5, tmp_path / "leak.png")
    assert [label for *_, label in drawn] == ["norm", "k=1", "k=2", "clustering", "batch_label_counts"]
    assert all(s is line.steps and v is line.values for (s, v, _), line in zip(drawn, lines, strict=True))
    assert (tmp_path / "leak.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no rows for party 3, cut layer"):
        leak_lines(leak_path, 3, "cut")


def test_the_skip_counts_are_the_whole_tables_in_the_order_they_first_appear(leak_path: Path,
                                                                              tmp_path: Path) -> None:
    """The same reasons and counts, in the order the reasons first appear in the file: not the
    order of the whole table's grouped aggregate, which report.md had before (this file holds a
    (who, layer) where the two differ)."""
    grouped_order_differs = False
    for who in ("1", "2", "1+2"):
        for layer in ("cut", "first"):
            assert list(skip_counts(leak_path, who, layer).items()) == \
                _whole_table_skips(leak_path, who, layer)
            grouped_order_differs |= list(skip_counts(leak_path, who, layer)) != \
                _grouped_order(leak_path, who, layer)
    assert grouped_order_differs
    assert REASONS[-1] in skip_counts(leak_path, "1", "first")
    assert REASONS[-1] not in skip_counts(leak_path, "1", "cut")
    assert skip_counts(leak_path, "3", "cut") == {}
    older = tmp_path / "older.parquet"  # written before leak.parquet had `parties`
    pq.write_table(pq.read_table(leak_path).drop_columns(["parties"]), older, row_group_size=50)
    for who, layer in (("1", "cut"), ("2", "first")):
        assert list(skip_counts(older, who, layer).items()) == _whole_table_skips(older, who, layer)
    assert [line.values.tobytes() for line in leak_lines(older, 2, "first")] == \
        [values.tobytes() for *_, values in _whole_table_lines(older, 2, "first")]


def _run_of(leak: Path, root: Path) -> tuple[RunDir, dict[str, Any]]:
    run = RunDir(root)
    run.attacker.mkdir(parents=True)
    leak.rename(run.leak)
    summary = {"run_id": "streamed", "seed": 5, "num_classes": 2, "warnings": [],
               "leak": leak_figures(parquet_batches(run.leak)).leak, "above_bound": []}
    return run, summary


def test_the_report_never_reads_the_whole_leak_table(leak_path: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read of leak.parquet is one row group with only the columns a part of the report uses."""
    from attacker.report.report import write_report

    run, summary = _run_of(leak_path, tmp_path / "run")
    read_row_group, reads = pq.ParquetFile.read_row_group, []

    def one_group(self, i, columns=None, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(columns)
        return read_row_group(self, i, columns=columns, **kwargs)

    def whole(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the whole of a parquet file was read")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", one_group)
    monkeypatch.setattr(pq.ParquetFile, "read", whole)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", whole)
    monkeypatch.setattr(pq, "read_table", whole)
    write_report(run, summary)
    assert "plot" not in " ".join(summary["warnings"])  # every plot was drawn
    assert sorted(p.name for p in run.report.glob("leak_party*.png")) == [
        "leak_party1_cut.png", "leak_party1_first.png", "leak_party2_cut.png", "leak_party2_first.png"]
    assert "Skipped (attack, batch) pairs: " in run.report_md.read_text()
    assert reads and max(len(columns) for columns in reads) <= 8


PEAK = """import json, sys, pyarrow as pa
from pathlib import Path
from attacker.report.report import write_report
from splitleak.artifacts.paths import RunDir
write_report(RunDir(Path(sys.argv[1])), json.loads(Path(sys.argv[2]).read_text()))
print(pa.default_memory_pool().max_memory())
"""


def test_the_reports_arrow_memory_is_a_row_group_not_the_table(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading 10 columns of every row, the report's Arrow memory peaked above the table's size:
    ~104 bytes a row, 1.6 GB at 150,000 steps. Read a row group at a time it stays near one."""
    monkeypatch.setattr(leak_file, "LEAK_CHUNK_ROWS", 1024)
    path = tmp_path / "leak.parquet"
    with LeakWriter(path) as writer:
        writer.add(_rows(400))  # 32,000 rows
    run, summary = _run_of(path, tmp_path / "run")
    columns = ["party_id", "parties", "layer", "attack", "metric", "step", "auc_flipped", "accuracy",
               "count_error", "skip_reason"]
    table = pq.read_table(run.leak, columns=columns).nbytes
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    found = subprocess.run([sys.executable, "-c", PEAK, str(run.root), str(tmp_path / "summary.json")],
                           capture_output=True, text=True, check=True)
    peak = int(found.stdout.strip().splitlines()[-1])
    assert pq.read_metadata(run.leak).num_rows == 32_000 and table > 2_000_000
    assert peak < table / 8, f"Arrow peak {peak / 1e6:.1f} MB for a {table / 1e6:.1f} MB table"


def test_a_long_runs_plots_draw_a_bounded_number_of_points(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A 200,000-step run's leak and training plots drew every step's point (and its rolling mean
    by a convolution of window × steps): time grew with the steps. Each line now draws at most
    DRAWN_AT_MOST points spanning what every point spans; the values handed in are untouched."""
    from attacker.report.leak_read import LeakLine

    saved: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.append(fig))
    rng = np.random.default_rng(0)
    steps = np.arange(1, 200_001)
    values = 0.5 + 0.5 * rng.random(steps.size)
    loss = rng.random(steps.size)
    loss[::3] = np.nan  # steps whose loss was not logged
    line = LeakLine("norm", "auc", steps, values.copy())
    bound = (steps, 0.7 + 0.01 * rng.random(steps.size))  # Marvell's, per batch
    plots.leak_over_training([line], 1, "cut", 0, tmp_path / "leak.png", bound)
    plots.training_curves(steps, loss, [{"step": 200_000, "test_auc": 0.9}], tmp_path / "t.png")
    drawn = [artist for fig in saved for ax in fig.axes for artist in ax.get_lines()]
    assert drawn and max(len(a.get_xdata()) for a in drawn) <= plots.DRAWN_AT_MOST
    faint, mean = saved[0].axes[0].get_lines()[:2]
    assert np.nanmin(faint.get_ydata()) == values.min() and np.nanmax(faint.get_ydata()) == values.max()
    assert faint.get_xdata()[0] == 1 and faint.get_xdata()[-1] == 200_000
    assert np.isfinite(mean.get_ydata()).all()
    assert np.isfinite(saved[1].axes[0].get_lines()[1].get_ydata()).all()  # NaNs: not a blank mean
    assert np.array_equal(line.values, values)


def test_thinning_keeps_each_runs_extremes_and_a_gap() -> None:
    steps = np.arange(10)
    values = np.array([3.0, 1.0, 2.0, np.nan, np.nan, np.nan, 4.0, 0.0, 5.0, 6.0])
    thin_steps, thin_values = plots._thin(steps, values, most=8)  # runs of 3, 3 and 4 points
    assert list(thin_steps) == [0, 1, 3, 7, 9]  # each run's extremes in step order; a NaN run: one
    assert np.array_equal(thin_values, [3.0, 1.0, np.nan, 0.0, 6.0], equal_nan=True)
    assert list(plots._thin(steps, values + np.arange(10), most=8)[0]) == [0, 1, 2, 3, 7, 9]  # step 0 kept
    assert plots._thin(steps, values, most=10)[1] is values
