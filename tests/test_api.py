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
    exec(compile("".join(blocks).replace('"runs/sweeps/tiny"', repr(str(sweep_dir))),  # noqa: S102
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
