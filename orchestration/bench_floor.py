"""The wire's floor: gRPC round trips of one party's step bytes between two fresh processes.

An echo service in a child process answers each message with one of the same size, over the
run's channel options and, as in a run, mutual TLS (or plaintext): what a step's transport
could not go below on this machine with nothing else running, beside which the bench's
"transport+scheduling" shows what the project itself adds.

    python -m orchestration.bench_floor PORT_FILE [TLS_DIR]   (the echo service; internal)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from splitleak import tls
from splitleak.config import TopologyConfig
from splitleak.fileio import write_atomically
from splitleak.transport import bind, create_channel, create_server, run_async

METHOD = "/splitleak.bench.Echo/Chat"
SERVER, CLIENT = tls.identities(1)[0], tls.passive_identity(1)
ROUND_TRIPS, WARMUP = 200, 20
START_TIMEOUT = 60.0  # s: the echo process imports grpc and binds


def _same(data: bytes) -> bytes:
    return data


class _Echo(grpc.GenericRpcHandler):
    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method != METHOD:
            return None

        async def chat(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
            async for message in requests:
                yield message

        return grpc.stream_stream_rpc_method_handler(chat, _same, _same)


async def _serve(port_file: Path, tls_dir: Path | None) -> None:
    server = create_server(TopologyConfig())
    server.add_generic_rpc_handlers((_Echo(),))
    port = bind(server, "127.0.0.1:0", tls_dir, SERVER)
    await server.start()
    write_atomically(port_file, lambda tmp: tmp.write_text(str(port)))  # whole, or not there
    await server.wait_for_termination()


async def _round_trips(address: str, nbytes: int, tls_dir: Path | None, count: int) -> list[float]:
    channel = create_channel(address, TopologyConfig(), tls_dir, CLIENT, SERVER)
    try:
        call = channel.stream_stream(METHOD, _same, _same)()
        payload = bytes(nbytes)
        took = []
        for _ in range(WARMUP + count):
            began = time.perf_counter()
            await call.write(payload)
            await call.read()
            took.append(time.perf_counter() - began)
        await call.done_writing()
        return took[WARMUP:]
    finally:
        await channel.close()


def round_trip_ms(nbytes: int, use_tls: bool = True, count: int = ROUND_TRIPS) -> float:
    """Median ms of `count` round trips of `nbytes` each way (after a warm-up) to an echo
    service in a child process, over mutual TLS when `use_tls`."""
    with tempfile.TemporaryDirectory(prefix="splitleak-floor-") as tmp:
        folder = Path(tmp)
        tls_dir = folder / "tls" if use_tls else None
        if tls_dir is not None:
            tls.generate(tls_dir, tls.identities(1))
        port_file = folder / "port"
        echo = subprocess.Popen([sys.executable, "-m", "orchestration.bench_floor", str(port_file),
                                 *([str(tls_dir)] if tls_dir else [])],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            end = time.monotonic() + START_TIMEOUT
            while not port_file.exists():
                if echo.poll() is not None or time.monotonic() > end:
                    raise RuntimeError("the echo service for the gRPC floor did not start: "
                                       + (echo.stderr.read().decode()[-500:] if echo.stderr and
                                          echo.poll() is not None else "no port in 60 s"))
                time.sleep(0.02)
            address = f"127.0.0.1:{port_file.read_text()}"
            took = run_async(_round_trips(address, nbytes, tls_dir, count))
        finally:
            echo.kill()
            echo.wait()
    return 1e3 * statistics.median(took)


def main(argv: list[str]) -> int:
    port_file = Path(argv[0])
    run_async(_serve(port_file, Path(argv[1]) if len(argv) > 1 else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
