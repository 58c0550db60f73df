"""What reaches the user's terminal: this project's log lines, not other libraries' chatter."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import orchestration.zygote_client
from orchestration.cli import main as splitleak_main
from splitleak.cli_common import setup_logging
from tests.conftest import small_config, write_config
from tests.test_cli_refusals import exit_code_and_text


def test_other_libraries_info_and_findfont_lines_stay_off_the_terminal(
        capsys: pytest.CaptureFixture) -> None:
    """torch's 'FakeTensor cache stats' (INFO, at exit after a Ctrl-C) and ~20 of matplotlib's
    'findfont: Font family ['cmtt10'] not found' warnings per report reached the terminal."""
    setup_logging("splitleak")
    try:
        logging.getLogger("torch._subclasses.fake_tensor").info("FakeTensor cache stats:")
        logging.getLogger("matplotlib.font_manager").warning(
            "findfont: Font family ['cmtt10'] not found. Falling back to DejaVu Sans.")
        logging.getLogger("grpc._cython").warning("a library's warning")
        for name in ("splitleak", "label_party.session", "attacker", "orchestration.run"):
            logging.getLogger(name).info("own line of %s", name)
        err = capsys.readouterr().err
    finally:
        logging.basicConfig(force=True)
    assert "FakeTensor" not in err and "findfont" not in err, err
    assert "a library's warning" in err, err
    for name in ("splitleak", "label_party.session", "attacker", "orchestration.run"):
        assert f"own line of {name}" in err, err


def test_ctrl_c_while_a_run_starts_says_it_stopped(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C while the party processes' zygote started ended the run with 130, silently."""
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(orchestration.zygote_client, "warm_up", interrupted)
    config = write_config(tmp_path, small_config(tmp_path))
    try:
        code, text = exit_code_and_text(splitleak_main, ["run", "--no-progress", str(config)], capsys)
    finally:
        logging.basicConfig(force=True)
    assert code == 130 and "stopped by Ctrl-C" in text, (code, text)
