"""Mutual TLS: a run trains over TLS, a party cannot speak for another, plaintext is refused."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestration.run import run_distributed
from splitleak import tls
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import PROTOCOL_VERSION, TopologyConfig, parse_config
from splitleak.transport import create_channel
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc
from tests.conftest import scaled, small_config, write_config

pytestmark = pytest.mark.slow


def test_run_over_mutual_tls(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, topology={"tls": True}))
    run = create_run_dir(cfg)
    outcome = run_distributed(cfg, run)
    assert outcome.final_eval["test_auc"] > 0.9
    # The run directory keeps who took part (certificates), not the private keys.
    assert (run.root / "tls" / "passive-party-2.pem").exists()
    assert not list((run.root / "tls").glob("*.key"))


def test_identity_is_bound_to_the_party_id(tmp_path: Path) -> None:
    path = write_config(tmp_path, small_config(
        tmp_path, topology={"tls": True, "passive_parties": 2, "join_deadline_s": 10}))
    certs = tmp_path / "certs"
    tls.generate(certs, tls.identities(2))
    port_file = tmp_path / "address"
    proc = subprocess.Popen([sys.executable, "-m", "label_party", "serve", "--config", str(path),
                             "--run-dir", str(tmp_path / "run"), "--port-file", str(port_file),
                             "--listen", "127.0.0.1:0", "--tls-dir", str(certs)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        end = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()[0]
            time.sleep(0.05)
        address = port_file.read_text().strip()
        request = pb.JoinRequest(protocol_version=PROTOCOL_VERSION, party_id=1,
                                 embedding_shape=[16], config_hash="x", num_rows=569)

        async def join(identity: str | None) -> grpc.aio.AioRpcError:
            directory = certs if identity else None
            async with create_channel(address, TopologyConfig(), directory, identity or "") as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await pb_grpc.LabelPartyStub(ch).Join(request, timeout=10)
                return err.value

        err = asyncio.run(join("passive-party-2"))  # party 2's certificate claiming party 1
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'passive-party-2', which may not act as passive party 1" in err.details()
        err = asyncio.run(join(None))  # plaintext against a TLS server
        assert err.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        proc.kill()
        proc.wait()


def test_tls_config_without_identities_exits_2(tmp_path: Path) -> None:
    path = write_config(tmp_path, small_config(tmp_path, topology={"tls": True}))
    result = subprocess.run([sys.executable, "-m", "passive_party", "run", "--config", str(path),
                             "--party-id", "1", "--label-party", "127.0.0.1:1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--tls-dir" in result.stderr


def test_private_keys_are_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """0600 from the moment the file exists: no chmod afterwards (a window where the key
    could be read), even under a permissive umask."""
    monkeypatch.setattr(Path, "chmod", lambda self, mode: None)
    old = os.umask(0)
    try:
        tls.generate(tmp_path, tls.identities(1))
    finally:
        os.umask(old)
    for key in tmp_path.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert stat.S_IMODE((tmp_path / "ca.pem").stat().st_mode) & 0o044  # certificates are public
    assert not list(tmp_path.glob(".*.tmp"))


def serve_sidecar(out: Path, tls_dir: Path, port_file: Path,
                  env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`attacker serve` with mutual TLS from `tls_dir`, its output (stdout and stderr) piped;
    returns it and its address once it serves."""
    proc = subprocess.Popen([sys.executable, "-m", "attacker", "serve", "--listen", "127.0.0.1:0",
                             "--out", str(out), "--tls-dir", str(tls_dir), "--port-file",
                             str(port_file)], env=env, cwd=Path(__file__).resolve().parents[1],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.monotonic() + scaled(60)
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()[0]
        time.sleep(0.05)
    return proc, port_file.read_text().strip()


def test_clients_pin_the_servers_role(tmp_path: Path) -> None:
    """A passive party's certificate serving on the sidecar's (or the label party's) address
    is refused by the client: the server must hold the role the client expects. (The servers
    are in-process: a role refuses at start to serve with another identity's pair.)"""
    from tests.test_tls_refusals import _serving

    certs = tmp_path / "certs"
    tls.generate(certs, tls.identities(2))

    async def health(target: str, server_identity: str | None) -> str:
        async with create_channel(target, TopologyConfig(), certs, "passive-party-1",
                                  server_identity=server_identity) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=scaled(5))
            except grpc.aio.AioRpcError as err:
                return err.code().name
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    async def go() -> list[str]:
        impostor, address = await _serving(certs, "passive-party-2")
        genuine, genuine_address = await _serving(certs, tls.ATTACKER)
        try:
            return [await health(address, None),  # any run identity, unpinned
                    await health(address, tls.ATTACKER),  # the tap's pin
                    await health(address, tls.LABEL_PARTY),  # the party's pin
                    await health(genuine_address, tls.ATTACKER)]
        finally:
            for server in (impostor, genuine):
                await server.stop(0)  # type: ignore[attr-defined]

    assert asyncio.run(go()) == ["SERVING", "UNAVAILABLE", "UNAVAILABLE", "SERVING"]


def test_tls_dir_with_plaintext_config_exits_2(tmp_path: Path) -> None:
    path = write_config(tmp_path, small_config(tmp_path, topology={"tls": False}))
    certs = tmp_path / "certs"
    tls.generate(certs, tls.identities(2))
    result = subprocess.run([sys.executable, "-m", "passive_party", "run", "--config", str(path),
                             "--party-id", "1", "--label-party", "127.0.0.1:1", "--tls-dir",
                             str(certs)], capture_output=True, text=True, timeout=scaled(120))
    assert result.returncode == 2, result.stderr
    assert "topology.tls = false" in result.stderr and "Traceback" not in result.stderr
