"""The notebook API (splitleak.api): the worked example of docs/api.md runs on the tiny sweep,
and `import splitleak` stays light."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from splitleak import open_run, open_sweep

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def test_import_splitleak_imports_no_api_until_asked() -> None:
    code = ("import sys, splitleak; heavy = {'splitleak.api', 'pandas', 'torch', 'pyarrow'} & "
            "set(sys.modules); assert not heavy, heavy; splitleak.open_run; "
            "assert 'splitleak.api' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_documented_example_runs_on_a_sweep(inprocess_sweep: tuple[Path, str]) -> None:
    sweep_dir, _ = inprocess_sweep
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 3
    names: dict[str, object] = {}
    exec(compile("".join(blocks).replace('"sweeps/tiny"', repr(str(sweep_dir))),  # noqa: S102
                 str(DOC), "exec"), names)
    points, comparison, leaks = names["points"], names["comparison"], names["leaks"]
    assert list(points["setting"]) == ["none", "marvell, defense.0.s=4.0"]  # type: ignore[index]
    assert list(points["outcome"]) == ["ok", "ok"]  # type: ignore[index]
    assert len(comparison) == 2 and len(leaks) > 0  # type: ignore[arg-type]


def test_a_sweep_and_a_run_read_what_their_files_hold(inprocess_sweep: tuple[Path, str]) -> None:
    sweep_dir, _ = inprocess_sweep
    sweep = open_sweep(sweep_dir)
    table = (sweep_dir / "compare" / "table.csv").read_text()
    assert repr(float(sweep.comparison["utility_mean"][0])) in table  # the number as written
    runs = sweep.runs(status=None)
    assert [r.root.name for r in runs] == list(sweep.points["run_dir"])
    run = runs[0]
    assert run.summary.schema_version == 1 and run.summary.leak
    assert set(run.metrics["type"]) == {"plan", "train", "eval"}


def test_a_directory_that_is_neither_says_so(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a run directory"):
        open_run(tmp_path)
    with pytest.raises(ValueError, match="not a sweep directory"):
        open_sweep(tmp_path)


def test_a_runs_timing_has_one_row_per_role_and_span(tmp_path: Path) -> None:
    from splitleak.artifacts.paths import RunDir
    from splitleak.artifacts.rundir import write_config
    from splitleak.artifacts.timing import Span, Timing, write_timing
    from splitleak.config import parse_config
    from tests.conftest import small_config

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    write_config(parse_config(small_config(tmp_path)), run)
    write_timing(run.label_timing, Timing(train_steps=10, spans={
        "compute": Span(seconds=0.5, count=10, ms_per_step=50.0),
        "wait": Span(seconds=0.2, count=10, ms_per_step=20.0)}))
    write_timing(run.passive_timing(2), Timing(train_steps=10, spans={
        "forward": Span(seconds=0.1, count=10, ms_per_step=10.0)}))
    timing = open_run(run.root).timing  # party 1 and the sidecar wrote none: no rows
    assert timing.to_dict("records") == [
        {"role": "label party", "span": "compute", "seconds": 0.5, "count": 10, "ms_per_step": 50.0},
        {"role": "label party", "span": "wait", "seconds": 0.2, "count": 10, "ms_per_step": 20.0},
        {"role": "passive party 2", "span": "forward", "seconds": 0.1, "count": 10,
         "ms_per_step": 10.0}]


def test_a_missing_or_damaged_table_is_named_with_what_writes_it(tmp_path: Path) -> None:
    """Run.summary of a run not analysed said 'cannot read .../summary.json: No such file or
    directory', not what writes it, as Run.leaks does."""
    from splitleak.api import TableError
    from splitleak.artifacts.paths import RunDir, SweepDir
    from splitleak.artifacts.rundir import write_config
    from splitleak.artifacts.summary import SummaryError
    from splitleak.artifacts.sweep import write_index_rows
    from splitleak.config import parse_config
    from tests.conftest import small_config

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    write_config(parse_config(small_config(tmp_path)), run)
    with pytest.raises(TableError, match=rf"{re.escape(str(run.leak))} does not exist: no leak "
                                         rf"table yet \(`attacker analyze {re.escape(str(run.root))}`"):
        _ = open_run(run.root).leaks
    with pytest.raises(SummaryError, match=rf"{re.escape(str(run.leak_summary))} does not exist: "
                                           r"no leak summary yet \(`attacker analyze "):
        _ = open_run(run.root).summary
    run.leak.parent.mkdir(parents=True)
    run.leak.write_bytes(b"PAR1 cut short")
    with pytest.raises(TableError, match=rf"{re.escape(str(run.leak))} is not a readable leak table"):
        _ = open_run(run.root).leaks

    sweep = SweepDir(tmp_path / "sweep")
    sweep.root.mkdir()
    write_index_rows(sweep.root, [])
    table = sweep.compare / "table.parquet"
    with pytest.raises(TableError, match=rf"{re.escape(str(table))} does not exist: no comparison "
                                         rf"table yet \(`splitleak compare .*`splitleak sweep` "
                                         rf"runs it at its end once some point is done, unless "
                                         rf"--no-compare\)"):
        _ = open_sweep(sweep.root).comparison
    table.parent.mkdir()
    table.write_text("setting,attack\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(table))} is not a readable comparison"):
        _ = open_sweep(sweep.root).comparison


def test_a_points_damaged_outcome_is_named_not_read_as_still_running(tmp_path: Path) -> None:
    from splitleak.artifacts.paths import SweepDir
    from splitleak.artifacts.sweep import SCHEMA, write_index_rows

    sweep = SweepDir(tmp_path / "sweep")
    point = sweep.point("p0")
    point.outcome.parent.mkdir(parents=True)
    point.outcome.write_text("{")
    row = dict.fromkeys(SCHEMA.names) | {"point": 0, "hash": "p0", "label": "none",
                                         "setting": "none", "variant": "none", "seed": 0,
                                         "status": "done", "run_dir": "p0"}
    write_index_rows(sweep.root, [row])
    with pytest.warns(UserWarning, match=rf"{re.escape(str(point.outcome))} is not a readable "
                                         r"outcome.*left empty in Sweep.points"):
        points = open_sweep(sweep.root).points
    assert list(points["status"]) == ["done"] and list(points["outcome"]) == [None]


def test_a_started_points_missing_run_directory_is_named(tmp_path: Path) -> None:
    """Sweep.runs() handed back a Run for a point whose directory was gone, whose config then
    failed with 'config file .../config.toml does not exist; give the path of a config TOML
    file' (the CLI's words), and Sweep.points showed its outcome empty, unsaid."""
    from splitleak.artifacts.paths import SweepDir
    from splitleak.artifacts.sweep import SCHEMA, write_index_rows

    sweep = SweepDir(tmp_path / "sweep")
    sweep.root.mkdir()
    rows = [dict.fromkeys(SCHEMA.names) | {"point": n, "hash": f"p{n}", "label": "none, seed=0",
                                           "setting": "none", "variant": "none", "seed": n,
                                           "status": status, "run_dir": f"p{n}"}
            for n, status in enumerate(("done", "pending"))]
    write_index_rows(sweep.root, rows)
    opened = open_sweep(sweep.root)
    gone = re.escape(str(sweep.point("p0").root))
    with pytest.raises(ValueError, match=rf"point 0 \(none, seed=0\) of the sweep .* is done in "
                                         rf"sweep.parquet, but its run directory {gone} does not "
                                         r"exist \(moved or deleted\?\)") as raised:
        opened.runs()
    assert "--" not in str(raised.value) and "give the path" not in str(raised.value)
    assert opened.runs(status="pending") == []  # not started: no directory yet, nothing wrong
    with pytest.warns(UserWarning, match=rf"{gone} does not exist, though the sweep index says "
                                         r"its point is done"):
        points = opened.points
    assert list(points["outcome"]) == [None, None]


def test_a_status_no_point_can_have_is_refused_naming_those_it_can(tmp_path: Path) -> None:
    """`sweep.runs(status="ok")` (an outcome's word, not the index's) gave [] without a word, as
    if no point had ended well."""
    from splitleak.artifacts.paths import SweepDir
    from splitleak.artifacts.sweep import write_index_rows

    sweep = SweepDir(tmp_path / "sweep")
    sweep.root.mkdir()
    write_index_rows(sweep.root, [])
    opened = open_sweep(sweep.root)
    with pytest.raises(ValueError, match=r"status='ok' is no sweep point's status: one of "
                                         r"'pending', 'running', 'done', 'failed', 'interrupted', "
                                         r"or None .*the outcome column of Sweep.points"):
        opened.runs(status="ok")
    assert opened.runs(status="failed") == []


def test_a_running_runs_outcome_is_read_again_until_it_has_ended(tmp_path: Path) -> None:
    """`run.outcome` of a run still training was None, and stayed None on that Run after the
    run had ended (a notebook polling it waited forever)."""
    from splitleak.artifacts.outcome import write_outcome
    from splitleak.artifacts.paths import RunDir
    from splitleak.artifacts.rundir import write_config
    from splitleak.config import parse_config
    from tests.conftest import small_config

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    write_config(parse_config(small_config(tmp_path)), run)
    opened = open_run(run.root)
    assert opened.outcome is None
    run.outcome.parent.mkdir()
    write_outcome(run, {"status": "ok", "seconds": 1.0})
    assert opened.outcome is not None and opened.outcome.status == "ok"
    run.outcome.unlink()
    assert opened.outcome.status == "ok"  # once ended, kept
