"""What `splitleak sweep --engine ray` says, fast and without a cluster, when no Ray cluster
answers at --address and when the one there refuses the driver."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import tomli_w

from orchestration.cli import main
from tests.conftest import small_config, write_config

ray = pytest.importorskip("ray", reason="the Ray engine needs the optional extra splitleak[ray]")

TRIES = "RAY_gcs_server_port_wait_time_s"


@pytest.fixture(autouse=True)
def _ray_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the sweep command sets for Ray is undone after each test."""
    for name in ("RAY_py_gcs_connect_timeout_s", TRIES, "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


def _sweep_on(tmp_path: Path, address: str) -> int:
    base = write_config(tmp_path, small_config(tmp_path, training={"epochs": 1}))
    path = tmp_path / "sweep.toml"
    path.write_text(tomli_w.dumps({"sweep": {"name": "s", "base": str(base), "seeds": [1],
                                             "output_dir": str(tmp_path / "sweeps")}}))
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(path), "--no-progress", "--no-compare", "--engine", "ray",
              "--address", address])
    return exit_info.value.code


def test_a_dead_address_exits_2_naming_it_at_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Ray alone kept retrying 'Failed to connect to GCS' for minutes."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    started = time.monotonic()
    assert _sweep_on(tmp_path, f"127.0.0.1:{port}") == 2
    assert time.monotonic() - started < 15
    err = capsys.readouterr().err
    assert f"no Ray cluster answers at --address 127.0.0.1:{port} (" in err, err
    assert "Traceback" not in err and not ray.is_initialized()


def test_a_cluster_that_refuses_the_driver_exits_2_in_one_sentence(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """ray.init's ConnectionError (another auth token here) is a sentence, not a traceback, and
    ray.init tries once, not 20 times."""
    tries = []

    def refuse(**kwargs: object) -> None:
        tries.append(os.environ.get(TRIES))
        cause = RuntimeError("Failed to connect to GCS.\nray.exceptions.AuthenticationError: RPC "
                             "error: InvalidAuthToken: Authentication token is missing or "
                             "incorrect. Note: RAY_AUTH_MODE is currently 'disabled'")
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}") from cause

    monkeypatch.setattr(ray, "init", refuse)
    with socket.socket() as gcs:  # something listens at the address
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        address = f"127.0.0.1:{gcs.getsockname()[1]}"
        assert _sweep_on(tmp_path, address) == 2
    err = capsys.readouterr().err
    assert tries == ["1"] and TRIES not in os.environ
    assert (f"the Ray cluster at --address {address} refused this driver or did not answer "
            "(AuthenticationError: RPC error: InvalidAuthToken: Authentication token is missing or "
            "incorrect); check the address") in " ".join(err.split()), err
    assert "Traceback" not in err

