"""`splitleak health HOST:PORT`: exit 0 when a party's gRPC health service says SERVING."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitleak.config import TopologyConfig
from splitleak.transport import create_channel


async def check(address: str, service: str = "", timeout: float = 5.0,
                tls_dir: Path | None = None, identity: str = "attacker") -> str:
    """The serving status name of `service` at `address` (raises grpc.aio.AioRpcError)."""
    async with create_channel(address, TopologyConfig(), tls_dir, identity) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def probe(address: str, service: str = "", timeout: float = 5.0, tls_dir: Path | None = None,
          identity: str = "attacker") -> tuple[bool, str]:
    """Whether `service` at `address` is SERVING, and a line saying so."""
    try:
        status = asyncio.run(check(address, service, timeout, tls_dir, identity))
    except grpc.aio.AioRpcError as err:
        return False, f"{address}: {err.code().name}: {err.details()}"
    return status == "SERVING", f"{address}: {status}"
