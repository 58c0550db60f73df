"""A run directory's config.toml edited after the run: its header's hash against its content,
warned of by `attacker analyze` as by compare and the API (tests/test_compare_inputs.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attacker.cli import main as attacker_main
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.run_config import edited_config, recorded_hash, written_by_a_run
from splitleak.config import load_config
from tests.test_bad_artifacts import analysed_run  # noqa: F401 - the fixture
from tests.test_cli_refusals import exit_code_and_text


def test_the_header_hash_of_a_run_s_config(analysed_run: Path) -> None:  # noqa: F811
    run = RunDir(analysed_run)
    assert recorded_hash(run.config) == load_config(run.config).hash
    assert written_by_a_run(analysed_run) and edited_config(run) == []
    assert not written_by_a_run(analysed_run / "report") and recorded_hash(analysed_run / "x") is None


def test_analyze_warns_of_an_edited_config_naming_both_hashes(
        analysed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    """`attacker analyze` read a config.toml edited since the run (seed changed) silently."""
    root = tmp_path / "run"
    shutil.copytree(analysed_run, root)
    config = RunDir(root).config
    recorded = recorded_hash(config)
    config.write_text(config.read_text().replace("seed = 3", "seed = 4"))
    edited = load_config(config).hash
    assert edited != recorded
    code, text = exit_code_and_text(attacker_main, ["analyze", str(root), "--attacks", "norm"], capsys)
    assert code == 0, text
    assert f"its content hashes to {edited}, not to the hash {recorded}" in " ".join(text.split())
