"""Ctrl-C stops an in-process run (`splitleak run --in-process`, the inprocess sweep engine)
between two steps, and its outcome says so."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from orchestration.reference import train_in_process
from splitleak.artifacts.outcome import read_outcome
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import parse_config
from tests.conftest import small_config


def test_ctrl_c_stops_an_in_process_run_at_once(tmp_path: Path) -> None:
    """asyncio.run only cancelled the step loop on Ctrl-C, which never waits: the run trained
    to its last step, then ended (130) without its models or outcome. It now stops at once."""
    cfg = parse_config(small_config(tmp_path, training={"epochs": 2, "batch_size": 16}))
    run = create_run_dir(cfg)
    steps: list[int] = []

    def on_record(record: dict[str, Any]) -> None:
        if record["type"] == "train":
            steps.append(record["step"])
            if record["step"] == 3:
                signal.raise_signal(signal.SIGINT)  # as Ctrl-C in the terminal

    with pytest.raises(KeyboardInterrupt):
        train_in_process(cfg, run, on_record)
    assert steps[-1] == 3, steps
    outcome = read_outcome(run)
    assert outcome["status"] == "interrupted" and outcome["step"] == 4, outcome
    assert "writes no checkpoints" in outcome["message"], outcome
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
