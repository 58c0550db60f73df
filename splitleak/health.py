"""`splitleak health HOST:PORT`: exit 0 when a party's gRPC health service says SERVING."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitleak import tls
from splitleak.config import TopologyConfig
from splitleak.transport import closed_unanswered, create_channel, tls_refusal

# The roles that serve, as their certificates name them: with TLS the probe accepts either, as
# a party accepts only its server's role, whatever host name or address it dials (a probe of
# the host's own name or IP failed "Hostname Verification" against localhost-only names).
SERVERS = (tls.LABEL_PARTY, tls.ATTACKER)


async def check(address: str, service: str = "", timeout: float = 5.0,
                tls_dir: Path | None = None, identity: str = "attacker") -> str:
    """The serving status name of `service` at `address` (raises grpc.aio.AioRpcError)."""
    own_first = sorted(SERVERS, key=lambda role: role != identity)  # a host probes its own
    # role first: a failed try is an ERROR line in the server's log (a healthcheck every 5 s)
    names: tuple[str | None, ...] = tuple(own_first) if tls_dir is not None else (None,)
    for name in names:
        try:
            async with create_channel(address, TopologyConfig(), tls_dir, identity,
                                      server_identity=name) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service),
                                         timeout=timeout)
                return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.aio.AioRpcError as err:
            if name == names[-1] or not _another_name(err):
                raise
    raise AssertionError("unreachable")


def _another_name(err: grpc.aio.AioRpcError) -> bool:
    """The server's certificate is signed by the CA, but names another role than the one tried."""
    refusal = tls_refusal(err)
    return refusal is not None and "hostname verification" in refusal.lower()


def probe(address: str, service: str = "", timeout: float = 5.0, tls_dir: Path | None = None,
          identity: str = "attacker") -> tuple[bool, str]:
    """Whether `service` at `address` is SERVING, and a line saying so."""
    try:
        status = asyncio.run(check(address, service, timeout, tls_dir, identity))
    except grpc.aio.AioRpcError as err:
        return False, f"{address}: {_why(err, tls_dir, identity)}"
    return status == "SERVING", f"{address}: {status}"


def _why(err: grpc.aio.AioRpcError, tls_dir: Path | None, identity: str) -> str:
    """Why the probe got no answer: a TLS / plaintext mismatch named as one (it said only
    'UNAVAILABLE: ... Socket closed' or gRPC's handshake error), else gRPC's own words."""
    refusal = tls_refusal(err)
    if refusal is not None and "wrong_version_number" in refusal.lower():
        return ("it speaks plaintext (topology.tls = false), this probe used TLS: probe it "
                "without --tls-dir")
    if _another_name(err):
        return (f"its TLS certificate is signed by {tls_dir / 'ca.pem' if tls_dir else 'the CA'} "
                f"but names neither {' nor '.join(SERVERS)}: probe a label party or a sidecar")
    if refusal is not None and tls_dir is not None:
        if "expired" in refusal.lower() or "not yet valid" in refusal.lower():
            return (f"it presents a TLS certificate outside its validity window ({refusal}): "
                    f"{tls.REMAKE}")
        return (f"this probe refused its TLS certificate ({refusal}): it is not signed by "
                f"{tls_dir / 'ca.pem'}: the server runs another run's identities, or --tls-dir "
                "is another run's; give every host ca.pem and its own pair from the same "
                "`splitleak certs DIR --parties N`")
    if closed_unanswered(err):
        if tls_dir is None:
            return ("it closed the connection unanswered, as a server speaking TLS closes a "
                    "plaintext one: probe it with --tls-dir DIR --identity NAME (this host's own "
                    "identity)")
        return (f"it closed the connection once the TLS handshake was done: it refused this "
                f"probe's certificate {tls_dir / (identity + '.pem')} (another run's identity?)")
    return f"{err.code().name}: {err.details()}"
