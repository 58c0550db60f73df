"""Mutual TLS: a run trains over TLS, a party cannot speak for another, plaintext is refused."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from orchestration.run import run_distributed
from splitleak import tls
from splitleak.config import PROTOCOL_VERSION, TopologyConfig, parse_config
from splitleak.rundir import create_run_dir
from splitleak.transport import create_channel
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc
from tests.conftest import small_config, write_config

pytestmark = pytest.mark.slow


def test_run_over_mutual_tls(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, topology={"tls": True}))
    run = create_run_dir(cfg)
    outcome = run_distributed(cfg, run)
    assert outcome.final_eval["test_auc"] > 0.9
    assert (run.root / "tls" / "passive-party-2.key").exists()


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
