"""Bad input to the services (health, relay, the roles' addresses, listening, resumes): exit 2
with one sentence naming what is wrong, never a traceback, a silent wait or a silent restart."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from attacker.cli import main as attacker_main
from attacker.sidecar.store import GradientStore
from label_party.cli import main as label_party_main
from orchestration import commands, relay
from orchestration.cli import main as splitleak_main
from passive_party.cli import main as passive_party_main
from splitleak import tls
from splitleak.addresses import AddressError, resolve_now
from splitleak.artifacts.gradient_index import read_index
from splitleak.artifacts.manifest import Manifest, write_manifest
from splitleak.artifacts.paths import RunDir
from splitleak.checkpoint import CheckpointError, resumable
from splitleak.config import TopologyConfig
from splitleak.fileio import sha256_file
from splitleak.transport import ListenError, bind, create_server
from tests.conftest import small_config, write_config
from tests.test_cli_refusals import exit_code_and_text


def run_main(main, argv: list[str], capsys: pytest.CaptureFixture,
             caplog: pytest.LogCaptureFixture | None = None) -> tuple[int, str]:
    """A CLI's main() in this process: its exit code and everything it printed or logged."""
    code, text = exit_code_and_text(main, argv, capsys)
    return code, text + (caplog.text if caplog is not None else "")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path, small_config(tmp_path))


@pytest.fixture
def tls_config(tmp_path: Path) -> Path:
    return write_config(tmp_path, small_config(tmp_path, topology={"tls": True}), "tls.toml")


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another socket listens on."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def not_utf8(tmp_path: Path) -> Path:
    path = tmp_path / "binary.bin"
    path.write_bytes(b"\xff\xfe\x00")
    return path


def test_health_refuses_an_incomplete_tls_identity(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    certs = tmp_path / "certs"
    tls.generate(certs, tls.identities(1))
    (tmp_path / "empty").mkdir()
    (tmp_path / "ca-dir" / "ca.pem").mkdir(parents=True)
    cases = [("missing", "attacker", "does not exist"), ("empty", "attacker", "incomplete"),
             ("ca-dir", "attacker", "incomplete"), ("certs", "bogus", "bogus.pem")]
    for directory, identity, expected in cases:
        code, text = run_main(splitleak_main, ["health", "127.0.0.1:1", "--timeout", "2",
                                               "--tls-dir", str(tmp_path / directory),
                                               "--identity", identity], capsys)
        assert code == 2 and expected in text and "Traceback" not in text, (directory, text)


@pytest.mark.parametrize("kind", ["directory", "not utf-8"])
def test_an_address_file_that_is_no_text_file_is_refused(kind: str, tmp_path: Path, config: Path,
                                                         capsys: pytest.CaptureFixture,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path if kind == "directory" else not_utf8(tmp_path)
    expected = "is a directory" if kind == "directory" else "not UTF-8"
    code, text = run_main(splitleak_main, ["relay", "--listen", "127.0.0.1:0", "--to", f"@{path}"],
                          capsys, caplog)
    assert code == 2 and expected in text and str(path) in text, text
    code, text = run_main(passive_party_main, [
        "run", "--config", str(config), "--party-id", "1", "--label-party", f"@{path}",
        "--run-dir", str(tmp_path / "run")], capsys, caplog)
    assert code == 2 and expected in text and "--label-party" in text, text


def test_waiting_for_an_address_file_says_so_then_fails_at_the_deadline(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    for path in (tmp_path / "missing" / "file", tmp_path / "empty.txt"):
        if path.name == "empty.txt":
            path.write_text("")
        with pytest.raises(AddressError, match="wrote no address"):
            resolve_now(f"@{path}", "label party", 0.05)
        assert f"waiting up to 0.05 s for the label party to write its address to {path}" \
            in caplog.text


def test_relay_to_an_address_file_logs_the_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture,
                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(relay, "TO_DEADLINE", 0.05)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code, text = run_main(splitleak_main, ["relay", "--listen", "127.0.0.1:0", "--to", f"@{empty}"],
                          capsys, caplog)
    assert code == 1 and f"waiting up to 0.05 s for the label party to write its address to {empty}" \
        in text and "wrote no address" in text, text


def test_passive_party_refuses_a_resume_directory_that_does_not_exist(
        tmp_path: Path, config: Path, capsys: pytest.CaptureFixture) -> None:
    code, text = run_main(passive_party_main, [
        "run", "--config", str(config), "--party-id", "1", "--label-party", "127.0.0.1:1",
        "--resume", str(tmp_path / "nope")], capsys)
    assert code == 2 and "--resume" in text and "nope" in text, text


@pytest.mark.parametrize("listen", ["garbage", "127.0.0.1:99999", "127.0.0.1:-1"])
def test_label_party_refuses_a_bad_listen_address(listen: str, tmp_path: Path, config: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    code, text = run_main(label_party_main, ["serve", "--config", str(config), "--listen", listen,
                                             "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "--listen" in text and "Traceback" not in text, text
    assert not (tmp_path / "run").exists()


def test_bind_names_the_address_and_why(busy_port: int) -> None:
    async def refused(address: str, why: str) -> None:  # a grpc.aio server needs a loop
        with pytest.raises(ListenError, match=f"cannot listen on {address}: .*{why}"):
            bind(create_server(TopologyConfig(tls=False)), address)

    for address, why in ((f"127.0.0.1:{busy_port}", "Address already in use"),
                         ("garbage", "not HOST:PORT")):
        asyncio.run(refused(address, why))


def test_a_port_in_use_is_bad_input_to_the_label_party_and_the_sidecar(
        busy_port: int, tmp_path: Path, config: Path, capsys: pytest.CaptureFixture) -> None:
    listen = f"127.0.0.1:{busy_port}"
    code, text = run_main(label_party_main, ["serve", "--config", str(config), "--listen", listen,
                                             "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and f"cannot listen on {listen}: Address already in use" in text, text
    code, text = run_main(attacker_main, ["serve", "--listen", listen, "--out",
                                          str(tmp_path / "out")], capsys)
    assert code == 2 and f"cannot listen on {listen}: Address already in use" in text, text


def test_a_port_in_use_is_worded_by_the_relay_as_by_the_roles(
        busy_port: int, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture) -> None:
    """It said "[Errno 98] error while attempting to bind on address ('127.0.0.1', P): address
    already in use", asyncio's words, where the roles say "Address already in use"."""
    listen = f"127.0.0.1:{busy_port}"
    code, text = run_main(splitleak_main, ["relay", "--listen", listen, "--to", "127.0.0.1:1"],
                          capsys, caplog)
    assert code == 2 and f"relay: cannot listen on {listen}: Address already in use" in text, text
    assert "Errno" not in text, text


def test_a_port_in_use_is_told_in_one_sentence_without_grpcs_own_line(
        busy_port: int, capfd: pytest.CaptureFixture) -> None:
    """gRPC printed "E1128 ... add_port.cc:83] Failed to add port to server: ..." to fd 2
    before the sentence; the port is now checked before gRPC tries it."""
    async def refused(address: str) -> None:
        with pytest.raises(ListenError, match=f"cannot listen on {re.escape(address)}: Address "
                                              "already in use"):
            bind(create_server(TopologyConfig(tls=False)), address)

    for host in ("127.0.0.1", "0.0.0.0", "[::]"):  # a wildcard: gRPC listens on both families
        asyncio.run(refused(f"{host}:{busy_port}"))
    assert "add_port" not in capfd.readouterr().err


def test_the_label_party_refuses_a_port_in_use_before_its_data_and_run_directory(
        busy_port: int, tmp_path: Path, config: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It loaded its data (minutes for a large file) and made the run directory first."""
    def no_data(*_: object) -> None:
        raise AssertionError("the data was loaded")

    monkeypatch.setattr("label_party.server.load_label_party_data", no_data)
    listen = f"127.0.0.1:{busy_port}"
    code, text = run_main(label_party_main, ["serve", "--config", str(config), "--listen", listen,
                                             "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and f"cannot listen on {listen}: Address already in use" in text, text
    assert not (tmp_path / "run").exists()


def test_splitleak_run_refuses_a_fixed_label_party_address_in_use_before_starting(
        busy_port: int, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """It started every role and said so ~20 s later, after the label party's imports."""
    address = f"127.0.0.1:{busy_port}"
    config = write_config(tmp_path, small_config(tmp_path, topology={"label_party_address": address}))
    code, text = run_main(splitleak_main, ["run", str(config), "--no-progress"], capsys)
    assert code == 2, text
    assert f"topology.label_party_address = '{address}'" in text and "Address already in use" in text
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1:0"])
def test_passive_party_refuses_a_port_it_cannot_connect_to(address: str, tmp_path: Path,
                                                           config: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    code, text = run_main(passive_party_main, [
        "run", "--config", str(config), "--party-id", "1", "--label-party", address,
        "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "--label-party" in text and "1..65535" in text, text


def test_a_port_file_that_is_a_directory_is_named_as_such(tmp_path: Path, config: Path,
                                                          capsys: pytest.CaptureFixture,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    code, text = run_main(splitleak_main, ["relay", "--listen", "127.0.0.1:0", "--to",
                                           "127.0.0.1:1", "--port-file", str(tmp_path)],
                          capsys, caplog)
    assert code == 2 and f"--port-file {tmp_path} is a directory" in text, text
    code, text = run_main(label_party_main, ["serve", "--config", str(config), "--port-file",
                                             str(tmp_path), "--run-dir", str(tmp_path / "run")],
                          capsys)
    assert code == 2 and f"--port-file {tmp_path} is a directory" in text, text


@pytest.mark.parametrize("party_id", ["0", "-1", "9"])
def test_passive_party_checks_its_id_before_its_identity(party_id: str, tmp_path: Path,
                                                         tls_config: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    code, text = run_main(passive_party_main, [
        "run", "--config", str(tls_config), "--party-id", party_id, "--label-party", "127.0.0.1:1",
        "--tls-dir", str(tmp_path / "no-certs"), "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "--party-id must be 1..2" in text, text


def checkpointed_run(tmp_path: Path, config: Path) -> RunDir:
    """A run directory with two complete checkpoints whose files match their manifests."""
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.config.write_text(config.read_text())
    for step, batches in ((3, 7), (6, 14)):
        directory = run.checkpoint(step, batches)
        directory.mkdir(parents=True)
        files = {}
        for name in ("label_party.pt", "passive_party_1.pt"):
            (directory / name).write_bytes(name.encode())
            files[name] = sha256_file(directory / name)
        write_manifest(run, Manifest(step=step, batches=batches, metrics_records=0,
                                     run_id=run.root.name, config_hash="", config={}, files=files))
    return run


def resume(run: RunDir, capsys: pytest.CaptureFixture,
           monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """`splitleak run --resume RUN` up to where it would start the parties (it must not)."""
    def started(*_: object, **__: object) -> None:
        raise AssertionError("the resume started the run's processes")

    monkeypatch.setattr(commands, "_distributed", started)
    args = argparse.Namespace(resume=run.root, in_process=False, config=None, no_progress=True)
    return run_main(lambda _: commands.resume_run(args, Console()), [], capsys)


def test_a_party_checkpoint_file_that_is_a_directory_is_refused_up_front(
        tmp_path: Path, config: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    run = checkpointed_run(tmp_path, config)
    for directory in run.checkpoints.iterdir():
        (directory / "passive_party_1.pt").unlink()
        (directory / "passive_party_1.pt").mkdir()
    code, text = resume(run, capsys, monkeypatch)
    assert code == 2 and "passive_party_1.pt is not a regular file" in text, text


@pytest.mark.parametrize("kind", ["empty", "garbage", "directory"])
def test_unreadable_manifests_are_refused_not_a_restart(kind: str, tmp_path: Path, config: Path,
                                                        capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    run = checkpointed_run(tmp_path, config)
    for directory in run.checkpoints.iterdir():
        manifest = directory / "manifest.json"
        manifest.unlink()
        if kind == "directory":
            manifest.mkdir()
        else:
            manifest.write_text("" if kind == "empty" else "{garbage")
    code, text = resume(run, capsys, monkeypatch)
    assert code == 2 and "manifest.json" in text and "step 0" in text and "resuming" not in text, text


def test_an_unreadable_newest_manifest_falls_back_and_a_missing_one_is_incomplete(
        tmp_path: Path, config: Path) -> None:
    run = checkpointed_run(tmp_path, config)
    older, newest = sorted(run.checkpoints.iterdir())
    (newest / "manifest.json").write_text("{garbage")
    assert resumable(run.root).step == 3
    (newest / "manifest.json").unlink()  # a kill before the manifest: ignored, as before
    (older / "manifest.json").unlink()
    assert resumable(run.root) is None
    (older / "manifest.json").write_text("")
    with pytest.raises(CheckpointError, match="manifest"):
        resumable(run.root)


def test_sidecar_resume_refuses_a_directory_that_is_no_run(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "empty").mkdir()
    code, text = run_main(attacker_main, ["serve", "--listen", "127.0.0.1:0", "--resume",
                                          str(tmp_path / "empty")], capsys)
    assert code == 2 and "is not a run directory" in text, text
    assert list((tmp_path / "empty").iterdir()) == []  # nothing made in it


def test_a_resumed_log_with_an_unreadable_index_says_so_and_writes_it_from_the_shards(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = GradientStore(tmp_path / "gradients", "r1")
    store.append(1, 0, 0, np.arange(4), {"cut_gradient": np.ones((4, 3), np.float32)})
    store.close()
    index = tmp_path / "gradients" / "index.json"
    index.write_text("")  # the shards are the log; the index only lists them
    resumed = GradientStore(tmp_path / "gradients", "r1", resume=True)
    assert str(index) in caplog.text and "written anew from the log's shards" in caplog.text
    assert resumed.counts(1) == (1, 4)
    assert read_index(index).parties["1"].shards[0].records == 1
