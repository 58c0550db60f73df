"""A bad data file ends in exit 2 naming the file, line and column, every time (issue 26,
items 1 and 8): `splitleak validate` reads every value, quoted CSV fields are values, no
process aborts at its exit, and a run whose party refused its data says so in its outcome."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from orchestration.cli import main as splitleak_main
from splitleak.artifacts.paths import RunDir
from splitleak.datasets import build_dataset
from tests.conftest import scaled, small_config, write_config
from tests.test_cli_refusals import QUIET_SHELL, exit_code_and_text


def criteo_lines(rows: int, bad: dict[int, tuple[int, str]] | None = None,
                 short_line: int | None = None, quoted: bool = False) -> str:
    """A Criteo train.txt; `bad`: line -> (field index, value) to put there; `short_line`
    loses its last field; `quoted`: a comma-separated copy with a header, every value quoted."""
    lines = []
    for i in range(rows):
        fields = [str(i % 2), *(str((i * 7 + j) % 50) for j in range(13)),
                  *(f"{(i * 31 + j) % 997:08x}" for j in range(26))]
        if bad and i + 1 in bad:
            field, value = bad[i + 1]
            fields[field] = value
        if i + 1 == short_line:
            fields = fields[:-1]
        lines.append(",".join(f'"{f}"' for f in fields) if quoted else "\t".join(fields))
    if quoted:
        names = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
        lines.insert(0, ",".join(f'"{name}"' for name in names))
    return "\n".join(lines) + "\n"


def criteo_config(tmp_path: Path, text: str, name: str = "criteo") -> Path:
    path = tmp_path / f"{name}.txt"
    path.write_text(text)
    return write_config(tmp_path, small_config(
        tmp_path, dataset={"name": "criteo", "params": {"path": str(path), "vocab_size": 100}},
        features={"passive": [[0, 20], [20, 39]]}), f"{name}.toml")


@pytest.mark.parametrize(("bad", "needle"), [
    ({2500: (4, "abc")}, "line 2500: column 'I4' is 'abc', expected an integer"),
    ({2999: (0, "yes")}, "line 2999: column 'label' is 'yes', expected one of '0', '1'"),
    ({7: (2, "1.5")}, "line 7: column 'I2' is '1.5', expected an integer"),
])
def test_validate_reads_every_value(tmp_path: Path, bad: dict, needle: str,
                                    capsys: pytest.CaptureFixture) -> None:
    config = criteo_config(tmp_path, criteo_lines(3000, bad))
    code, text = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    assert code == 2 and "Traceback" not in text, text
    assert f"criteo.txt, {needle}" in " ".join(text.split()), text


def test_quoted_csv_fields_are_values(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A CSV copy whose writer quoted every field reads as the plain file does."""
    plain = build_dataset("criteo", {"path": str(criteo_config(tmp_path, criteo_lines(40))
                                                 .with_suffix(".txt"))})
    config = criteo_config(tmp_path, criteo_lines(40, quoted=True), "quoted")
    code, text = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    assert code == 0, text
    quoted = build_dataset("criteo", {"path": str(config.with_suffix(".txt"))})
    np.testing.assert_array_equal(quoted.features((0, 39)).numeric, plain.features((0, 39)).numeric)
    np.testing.assert_array_equal(quoted.features((0, 39)).categorical,
                                  plain.features((0, 39)).categorical)
    assert quoted.labels().tolist() == plain.labels().tolist()
    bad = criteo_config(tmp_path, criteo_lines(40, {12: (3, "x,y")}, quoted=True), "quoted_bad")
    code, text = exit_code_and_text(splitleak_main, ["validate", str(bad)], capsys)
    assert code == 2 and "line 13: column 'I3' is 'x,y', expected an integer" in text, text


def test_in_process_run_refuses_a_bad_value_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = criteo_config(tmp_path, criteo_lines(300, {250: (4, "abc")}))
    code, text = exit_code_and_text(splitleak_main, ["run", str(config), "--in-process",
                                                      "--no-progress"], capsys)
    assert code == 2 and "Traceback" not in text, text
    assert "line 250: column 'I4' is 'abc'" in " ".join(text.split()), text


@pytest.mark.slow
def test_validate_on_a_short_row_exits_2_every_time(tmp_path: Path) -> None:
    """At 920e7e0 about one try in three aborted (134, "terminate called without an active
    exception") after printing the right message: pyarrow's reader released its Python
    handler on an I/O thread while the interpreter was tearing down. 20 tries, 4 at a time."""
    config = criteo_config(tmp_path, criteo_lines(3, short_line=2))

    def attempt(_: int) -> subprocess.CompletedProcess:
        return subprocess.run([*QUIET_SHELL, sys.executable, "-m", "orchestration", "validate",
                               str(config)], capture_output=True, text=True, timeout=scaled(120))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(attempt, range(20)))
    codes = [r.returncode for r in results]
    assert codes == [2] * 20, (codes, [r.stderr[-500:] for r in results if r.returncode != 2])
    for result in results:
        assert "line 2: expected 40 fields" in result.stderr and "terminate" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("bad", "culprit"), [
    ({250: (0, "yes")}, "label party"),  # only the label party reads the labels
    ({250: (4, "abc")}, "passive party 1"),  # I4 is in passive party 1's columns
])
def test_a_party_refusing_its_data_fails_the_run_naming_it(tmp_path: Path, bad: dict,
                                                           culprit: str) -> None:
    """The run exits 2 (bad input) with the party's own DatasetError, never a SIGABRT, and its
    outcome says "failed" naming that party (not "interrupted": the orchestrator stopped the
    others)."""
    config = criteo_config(tmp_path, criteo_lines(300, bad))
    result = subprocess.run([*QUIET_SHELL, sys.executable, "-m", "orchestration", "run",
                             str(config), "--no-progress"], capture_output=True, text=True,
                            timeout=scaled(240))
    text = " ".join(result.stdout.split())
    assert result.returncode == 2, text + result.stderr
    assert f"run failed: {culprit} exited with code 2" in text, text
    assert "DatasetError" in text and "line 250: column" in text and "SIGABRT" not in text, text
    outcome = json.loads(RunDir(next((tmp_path / "runs").iterdir())).outcome.read_text())
    assert outcome["status"] == "failed" and outcome["culprit"] == culprit, outcome
    assert "DatasetError" in outcome["message"], outcome
