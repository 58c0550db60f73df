"""A fixed label-party port in use: named once the run (or sweep) is held, every point's checked."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from orchestration.cli import main
from orchestration.sweep.command import check_ports
from orchestration.sweep.local import LocalEngine
from orchestration.sweep.points import resolve
from orchestration.sweep.spec import parse_sweep
from splitleak.cli_common import BadInput
from splitleak.config import parse_config
from splitleak.validation import validated
from tests.conftest import small_config, write_config
from tests.runs import held_by_another
from tests.test_checkpoints import fresh_run
from tests.test_cli_refusals import exit_code_and_text


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another socket listens on (the live run's own label party, say)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def test_a_resume_of_a_run_in_use_names_the_run_not_its_port(
        tmp_path: Path, busy_port: int, capsys: pytest.CaptureFixture) -> None:
    """The port check ran before the run's lock: a second `--resume` of a live run with a fixed
    address said "free that port" (the live run's own label party) instead of "in use"."""
    cfg = validated(parse_config(small_config(
        tmp_path, topology={"label_party_address": f"127.0.0.1:{busy_port}"})))
    run = fresh_run(cfg, tmp_path / "run")
    with held_by_another(run.root / "run.lock"):
        code, text = exit_code_and_text(main, ["run", "--resume", str(run.root), "--no-progress"],
                                        capsys)
    assert code == 2 and "in use by another splitleak process (pid 4242)" in text, text
    assert "free that port" not in text, text


def test_a_sweep_in_use_is_named_not_its_port(tmp_path: Path, busy_port: int,
                                               capsys: pytest.CaptureFixture) -> None:
    base = write_config(tmp_path, small_config(
        tmp_path, topology={"label_party_address": f"127.0.0.1:{busy_port}"}))
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(tomli_w.dumps({"sweep": {"name": "s", "base": str(base), "seeds": [1, 2],
                                              "output_dir": str(tmp_path / "sweeps")}}))
    (tmp_path / "sweeps" / "s").mkdir(parents=True)
    with held_by_another(tmp_path / "sweeps" / "s" / "sweep.lock"):
        code, text = exit_code_and_text(main, ["sweep", str(sweep), "--no-progress", "--jobs", "1"],
                                        capsys)
    assert code == 2 and "pid 4242" in text and "free that port" not in text, text


def test_every_points_fixed_address_is_checked(tmp_path: Path, busy_port: int,
                                               capsys: pytest.CaptureFixture) -> None:
    """Only the first point's address was checked: a later point's port in use started its
    roles and failed ~20 s later."""
    sweep = parse_sweep({"sweep": {"name": "s", "seeds": [1]}, "axes": {
        "topology.label_party_address": ["127.0.0.1:0", f"127.0.0.1:{busy_port}"]}}, "s")
    points = resolve(sweep, parse_config(small_config(tmp_path)), tmp_path / "s")
    with pytest.raises(BadInput):
        check_ports(points, LocalEngine(jobs=1))
    assert f"127.0.0.1:{busy_port}': the label party cannot listen" in capsys.readouterr().err


def test_a_label_party_resuming_a_run_it_serves_names_the_run_not_its_port(
        tmp_path: Path, busy_port: int, capsys: pytest.CaptureFixture) -> None:
    from label_party.cli import main as label_party_main

    cfg = validated(parse_config(small_config(
        tmp_path, topology={"label_party_address": f"127.0.0.1:{busy_port}"})))
    run = fresh_run(cfg, tmp_path / "run")
    run.label_party.mkdir()
    with held_by_another(run.serving_lock):
        code, text = exit_code_and_text(label_party_main, ["serve", "--resume", str(run.root)],
                                        capsys)
    assert code == 2 and "pid 4242" in text and "free that port" not in text, text
