"""Nothing is written outside a run directory (issue 26, item 5): a resume or an analysis
refuses a symbolic link it would write through, and a run or sweep name is one plain
directory name that fits the file system."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from attacker.cli import main as attacker_main
from orchestration.cli import main as splitleak_main
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import write_config
from splitleak.config import parse_config
from tests.conftest import small_config
from tests.conftest import write_config as write_toml
from tests.test_cli_refusals import exit_code_and_text


def _outside(tmp_path: Path, lines: int = 200) -> Path:
    outside = tmp_path / "outside.jsonl"
    outside.write_text("".join(f'{{"type": "train", "step": {i}}}\n' for i in range(lines)))
    return outside


def test_resume_refuses_a_symlinked_metrics_file(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    """At 920e7e0 the resume cut the linked file outside the run from 200 lines to 48."""
    cfg = parse_config(small_config(tmp_path))
    run = RunDir(tmp_path / "run")
    run.label_party.mkdir(parents=True)
    write_config(cfg, run)
    outside = _outside(tmp_path)
    run.metrics.symlink_to(outside)
    before = outside.read_text()
    code, text = exit_code_and_text(splitleak_main, ["run", "--resume", str(run.root),
                                                     "--no-progress"], capsys)
    text = " ".join(text.split())
    assert code == 2 and "Traceback" not in text, text
    assert "metrics.jsonl is a symbolic link" in text and "outside" in text, text
    assert outside.read_text() == before


def test_the_sidecar_refuses_to_resume_through_a_link(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    run.attacker.symlink_to(tmp_path / "elsewhere")
    code, text = exit_code_and_text(attacker_main, ["serve", "--listen", "127.0.0.1:0",
                                                    "--resume", str(run.root)], capsys)
    assert code == 2 and "attacker is a symbolic link" in " ".join(text.split()), text
    assert not list((tmp_path / "elsewhere").iterdir())


def test_analyze_refuses_to_write_through_a_symlinked_report(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    run.report.symlink_to(tmp_path / "elsewhere")
    code, text = exit_code_and_text(attacker_main, ["analyze", str(run.root)], capsys)
    assert code == 2 and "report is a symbolic link" in " ".join(text.split()), text
    assert not list((tmp_path / "elsewhere").iterdir())


@pytest.mark.parametrize(("name", "needle"), [
    ("..", "run.name: '..' is not a directory name of its own"),
    (".", "run.name: '.' is not a directory name of its own"),
    ("n" * 201, "run.name: String should have at most 200 characters"),
])
def test_a_run_name_must_be_one_directory_name_that_fits(tmp_path: Path, name: str, needle: str,
                                                         capsys: pytest.CaptureFixture) -> None:
    config = write_toml(tmp_path, small_config(tmp_path, run={"name": name, "seed": 3,
                                                              "output_dir": str(tmp_path / "runs")}))
    code, text = exit_code_and_text(splitleak_main, ["validate", str(config)], capsys)
    assert code == 2 and needle in text, text


@pytest.mark.parametrize(("name", "needle"), [
    ("..", "sweep.name: '..' is not a directory name of its own"),
    ("s" * 256, "sweep.name: String should have at most 255 characters"),
])
def test_a_sweep_name_must_be_one_directory_name_that_fits(tmp_path: Path, name: str, needle: str,
                                                           capsys: pytest.CaptureFixture) -> None:
    """At 920e7e0 `name = ".."` validated and the sweep wrote into the output directory's
    parent (overwriting a sweep.toml there)."""
    output = tmp_path / "out" / "sweeps"
    output.mkdir(parents=True)
    (tmp_path / "out" / "sweep.toml").write_text("mine\n")
    base = write_toml(tmp_path, small_config(tmp_path), "base.toml")
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(tomli_w.dumps({"sweep": {"name": name, "base": str(base),
                                              "output_dir": str(output), "seeds": [1]}}))
    code, text = exit_code_and_text(splitleak_main, ["sweep", str(sweep), "--no-progress"], capsys)
    assert code == 2 and needle in text, text
    assert (tmp_path / "out" / "sweep.toml").read_text() == "mine\n"
    assert not list(output.iterdir())
