"""Shared fixtures: small experiment configs written to tmp files, a clean environment."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from splitleak.config import ExperimentConfig, parse_config

# One knob for every deadline in the tests: a loaded machine slows the suite down instead of
# failing it (e.g. SPLITLEAK_TEST_TIME_SCALE=3 while other jobs share the cores).
TIME_SCALE = float(os.environ.get("SPLITLEAK_TEST_TIME_SCALE", "1"))


def pytest_configure(config: pytest.Config) -> None:
    """Deliver Ctrl-C to the processes the tests start: a background job of a non-interactive
    shell (e.g. `bash .ci/run &`) starts with SIGINT ignored, every child inherits that, and
    the tests that press Ctrl-C on a run or a sweep would then watch it run to its end."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests skip, saying why, where torch sees no CUDA device (CI never has one)."""
    import torch

    if torch.cuda.is_available() or os.environ.get("SPLITLEAK_GPU_TEST_DEVICE") == "cpu":
        return
    reason = (f"needs a CUDA device; torch {torch.__version__} sees none "
              f"({'a CPU-only build' if not torch.version.cuda else 'no GPU visible'})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


def scaled(seconds: float) -> float:
    """A test deadline or timeout, stretched by SPLITLEAK_TEST_TIME_SCALE."""
    return seconds * TIME_SCALE


def small_config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A fast binary experiment on breast_cancer with 2 passive parties."""
    data: dict[str, Any] = {
        "run": {"name": "t", "seed": 3, "output_dir": str(tmp_path / "runs")},
        "dataset": {"name": "breast_cancer", "test_fraction": 0.25},
        "features": {"passive": [[0, 15], [15, 30]]},
        "model": {"kind": "mlp", "layers": [16, 8], "cut_layer": 1},
        "training": {"batch_size": 64, "epochs": 2, "eval_interval": 3,
                     "optimizer": {"name": "adam", "lr": 0.01}},
        "topology": {"passive_parties": 2, "step_deadline_s": scaled(20),
                     "join_deadline_s": scaled(30), "tls": False},
    }
    for section, values in overrides.items():
        if section != "features" and isinstance(values, dict) and isinstance(data.get(section), dict):
            data[section] = {**data[section], **values}
        else:
            data[section] = values
    return data


def write_config(tmp_path: Path, data: dict[str, Any], name: str = "exp.toml") -> Path:
    path = tmp_path / name
    path.write_text(tomli_w.dumps(data))
    return path


@pytest.fixture
def make_config(tmp_path: Path):
    def make(**overrides: Any) -> ExperimentConfig:
        return parse_config(small_config(tmp_path, **overrides))

    return make


TINY_SWEEP_VARIANTS = [{"name": "none"},
                       {"name": "marvell", "set": {"defense": [{"name": "marvell"}]},
                        "axes": {"defense.0.s": [4.0]}}]


def tiny_sweep_file(root: Path, name: str = "tiny", seeds: tuple[int, ...] = (0,)) -> Path:
    """No defense and Marvell (s = 4) on breast_cancer, 4 train steps each, analysed by norm."""
    base = small_config(root, training={"epochs": 1, "max_steps": 4, "eval_interval": 2},
                        attacker={"attacks": ["norm"]})
    path = root / f"{name}.toml"
    path.write_text(tomli_w.dumps({
        "sweep": {"name": name, "base": str(write_config(root, base, f"{name}_base.toml")),
                  "output_dir": str(root / "sweeps"), "seeds": list(seeds)},
        "variant": TINY_SWEEP_VARIANTS}))
    return path


@pytest.fixture(scope="session")
def inprocess_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The tiny sweep run once per session by `splitleak sweep --engine inprocess --jobs 1`, in
    this process (nothing started): its sweep directory and what the command printed."""
    import contextlib
    import io

    from orchestration.cli import main

    root = tmp_path_factory.mktemp("inprocess_sweep")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["sweep", str(tiny_sweep_file(root)), "--engine", "inprocess", "--jobs", "1",
                     "--no-progress"])
    assert code == 0, printed.getvalue()
    return root / "sweeps" / "tiny", printed.getvalue()
