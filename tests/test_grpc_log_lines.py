"""A refused TLS handshake is told by the party's own sentence, without gRPC's C-core lines
("I1128 ... ssl_transport_security.cc ... Handshake failed") on either side's stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from splitleak import tls
from tests.conftest import scaled
from tests.test_tls import serve_sidecar

ROOT = Path(__file__).resolve().parents[1]
CORE_LINE = ".cc:"  # gRPC's prefix: "I1128 06:40:09.588691 31877 ssl_transport_security.cc:2563]"


def _env() -> dict[str, str]:
    """The environment a user starts a role in: no GRPC_VERBOSITY of their own."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    return {**env, "PYTHONPATH": str(ROOT)}


def test_refused_handshakes_print_no_grpc_core_lines_on_either_side(tmp_path: Path) -> None:
    certs, others = tmp_path / "certs", tmp_path / "others"
    tls.generate(certs, tls.identities(1))
    tls.generate(others, tls.identities(1))  # another run's CA: its sidecar is refused
    server, address = serve_sidecar(tmp_path / "run", certs, tmp_path / "attacker.address", _env())
    try:
        said = []
        for tls_args in ([], ["--tls-dir", str(others), "--identity", "attacker"]):
            probe = subprocess.run([sys.executable, "-m", "orchestration", "health", address,
                                    "--timeout", str(scaled(5)), *tls_args], env=_env(), cwd=ROOT,
                                   capture_output=True, text=True, timeout=scaled(60))
            assert probe.returncode != 0, probe.stdout + probe.stderr
            said.append(probe.stdout + probe.stderr)
    finally:
        server.terminate()
        said.append(server.communicate(timeout=scaled(30))[0])
    plaintext, other_ca, sidecar = said
    assert "TLS" in plaintext and "TLS" in other_ca, said
    for text in said:
        assert CORE_LINE not in text, text
