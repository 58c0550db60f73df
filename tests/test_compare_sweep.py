"""compare reads what the sweep wrote: one name per knob (the axis path as the sweep file wrote
it), the variant as the defense family, the index's axes and overrides; it derives them from the
config only for runs outside a sweep (and for an index written before it had axes). End to end
on a tiny sweep run by the in-process engine."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchestration.compare.read import find_runs
from orchestration.compare.report import write_report
from orchestration.compare.table import compare
from orchestration.compare.trends import trends
from orchestration.sweep.index import SweepIndex, read_index
from orchestration.sweep.points import resolve
from orchestration.sweep.spec import parse_sweep
from splitleak.artifacts.paths import SWEEP_INDEX_FILE as INDEX_FILE
from splitleak.config import parse_config
from tests.conftest import small_config
from tests.test_compare import fake_run, leak_entry

SWEEP = {"sweep": {"name": "s", "seeds": [0, 1, 2]},
         "variant": [{"name": "Vanilla"},  # not "no defense": the baseline is its config's
                     {"name": "Li et al.", "set": {"defense": [{"name": "marvell"}]},
                      "axes": {"defense.0.s": [1.0, 4.0]}}]}


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    """Fake analysed runs of every point: Marvell lowers the norm leak and costs utility by s."""
    points = resolve(parse_sweep(SWEEP), parse_config(small_config(tmp_path)), tmp_path / "s")
    index = SweepIndex(tmp_path / "s", points, "inprocess")
    for point in points:
        s = dict(point.setting_axes).get("defense.0.s", 0.0)
        fake_run(point.run_dir, point.config.model_dump(mode="json"), 0.95 - 0.01 * s + 0.001 * point.seed,
                 [leak_entry("norm", 0.9 - 0.05 * s + 0.01 * point.seed, 0.95 - 0.05 * s)])
        index.mark(point, "done", 1.0)
    return tmp_path / "s"


def test_the_index_keeps_each_points_axes_and_overrides(sweep_dir: Path) -> None:
    rows = read_index(sweep_dir)
    last = rows[-1]
    assert last["setting"] == "Li et al., defense.0.s=4.0" and last["variant"] == "Li et al."
    assert json.loads(last["axes"]) == {"defense.0.s": 4.0}  # the seed is its own column
    assert json.loads(last["overrides"]) == {"defense": [{"name": "marvell"}], "defense.0.s": 4.0,
                                             "run.seed": 2}
    assert json.loads(rows[0]["axes"]) == {}


def test_compare_names_each_knob_as_the_sweep_file_wrote_it(sweep_dir: Path, tmp_path: Path) -> None:
    runs, warnings = find_runs([sweep_dir])
    assert len(runs) == 9 and not warnings
    comparison = compare(runs, dcs_ap="auc")
    rows = {r["setting"]: r for r in comparison.rows}
    assert list(rows) == ["Vanilla", "Li et al., defense.0.s=1.0", "Li et al., defense.0.s=4.0"]
    strong = rows["Li et al., defense.0.s=4.0"]
    assert strong["family"] == "Li et al." and json.loads(strong["strengths"]) == {"defense.0.s": 4.0}
    assert strong["baseline"] == "Vanilla" and strong["utility_drop_mean"] == pytest.approx(0.04)
    assert strong["leak_change_mean"] == pytest.approx((0.75 - 0.95) / 0.95)  # the p95, by seed
    (trend,) = trends(comparison.rows)
    assert (trend.family, trend.parameter, trend.direction) == ("Li et al.", "defense.0.s", "falls")
    text = write_report(comparison, tmp_path / "out", [sweep_dir]).read_text()
    assert "| Li et al. | defense.0.s | – | norm |" in text  # the leak-vs-strength table
    settings = text[text.index("## Settings"):]
    assert "overrides that differ" in settings
    assert '`defense = [{"name": "marvell"}]`, `defense.0.s = 4.0`' in settings
    assert (tmp_path / "out" / "strength_li_et_al.png").exists()


def test_runs_outside_a_sweep_are_named_from_their_config(sweep_dir: Path) -> None:
    """The same run directories given one by one: no index, so the family and the strengths
    come from the config, as before sweeps wrote their axes."""
    runs, _ = find_runs(sorted(p for p in sweep_dir.iterdir() if (p / "config.toml").exists()))
    rows = {r["setting"]: r for r in compare(runs).rows}
    assert set(rows) == {"no defense", "marvell s=1", "marvell s=4"}
    assert rows["marvell s=4"]["family"] == "marvell"
    assert json.loads(rows["marvell s=4"]["strengths"]) == {"marvell.s": 4.0}
    assert rows["marvell s=4"]["utility_drop_mean"] == pytest.approx(0.04)  # the same numbers


def test_an_index_written_before_axes_is_read_as_it_was(sweep_dir: Path) -> None:
    path = sweep_dir / INDEX_FILE
    pq.write_table(pq.read_table(path).drop_columns(["axes"]), path)
    assert read_index(sweep_dir)[-1]["axes"] is None
    runs, _ = find_runs([sweep_dir])
    rows = {r["setting"]: r for r in compare(runs).rows}
    strong = rows["Li et al., defense.0.s=4.0"]  # its setting column, the family derived
    assert strong["family"] == "marvell" and json.loads(strong["strengths"]) == {"marvell.s": 4.0}


def test_an_inprocess_sweep_end_to_end(inprocess_sweep: tuple[Path, str]) -> None:
    """`splitleak sweep --engine inprocess --jobs 1`: every point trained and analysed, the
    comparison named by the sweep file's own paths."""
    sweep_dir, printed = inprocess_sweep
    out = " ".join(printed.split())
    assert "(inprocess engine, 1 at a time)" in out and "index: 2 done" in out
    assert "marvell, defense.0.s=4.0" in out
    table = pq.read_table(sweep_dir / "compare" / "table.parquet").to_pylist()
    assert [(r["setting"], r["family"], r["strengths"]) for r in table] == [
        ("none", "none", "{}"), ("marvell, defense.0.s=4.0", "marvell", '{"defense.0.s": 4.0}')]
    assert table[1]["baseline"] == "none"
