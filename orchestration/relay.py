"""A shaping TCP relay: a wide-area link between a passive party and the label party, emulated.

Each direction is a link of its own: bytes are serialised at `bandwidth_mbit` (a chunk
occupies the link for size / bandwidth), then arrive `one_way_latency_ms` later, plus a
normal jitter of standard deviation `jitter_ms`, never before the chunk sent ahead of them
(TCP keeps order). What is in flight is bounded (FLIGHT chunks per direction): a sender
faster than the link is slowed by TCP's own flow control, as on a real link. The relay sees
only TCP bytes, so mutual TLS stays end to end between the parties.

    splitleak relay --to 127.0.0.1:50051 --listen 127.0.0.1:0 --latency-ms 25 --bandwidth-mbit 100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from splitleak.addresses import (
    AddressError,
    check_address_file,
    check_peer,
    resolve_now,
)
from splitleak.cli_common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    say_when_terminated,
    setup_logging,
)
from splitleak.config import ConfigError, NetworkConfig, format_validation_error, load_config
from splitleak.fileio import write_atomically
from splitleak.transport import run_async, why_not_listening
from splitleak.wire import RefusalLog

log = logging.getLogger("relay")
CHUNK = 64 << 10  # bytes read at a time
FLIGHT = 64  # chunks queued per direction: 4 MiB, over the bandwidth-delay product of WAN links
# Connections carried at once: a party's channel needs one (two while gRPC reconnects); each
# holds up to 2 x FLIGHT chunks, so the relay's memory stays bounded whoever connects.
MAX_CONNECTIONS = 4
TO_DEADLINE = 120.0  # s: how long `--to @FILE` waits for the label party's address
# A party's connection is held this long while nothing listens at --to (the label party not
# started yet, or restarting to resume), trying again every UPSTREAM_RETRY s.
UPSTREAM_WAIT = TO_DEADLINE
UPSTREAM_RETRY = 0.2


class PortFileError(Exception):
    """The relay listens but cannot write the address file its peers would read."""


@dataclass
class Link:
    """One direction's schedule: when each chunk written now arrives at the other end."""

    latency_s: float
    bandwidth_bps: float | None  # None: no limit
    jitter_s: float = 0.0
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    _free_at: float = 0.0  # when the link has serialised everything given so far
    _last_arrival: float = 0.0

    @classmethod
    def of(cls, network: NetworkConfig, seed: int) -> Link:
        bandwidth = network.bandwidth_mbit * 1e6 if network.bandwidth_mbit else None
        return cls(network.one_way_latency_ms / 1e3, bandwidth, network.jitter_ms / 1e3,
                   np.random.default_rng(seed))

    def arrival(self, now: float, size: int) -> float:
        start = max(now, self._free_at)
        self._free_at = start + (size * 8 / self.bandwidth_bps if self.bandwidth_bps else 0.0)
        jitter = self.rng.normal(0.0, self.jitter_s) if self.jitter_s else 0.0
        self._last_arrival = max(self._free_at + max(self.latency_s + jitter, 0.0),
                                 self._last_arrival)
        return self._last_arrival


async def _carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link) -> None:
    """Forward one direction through `link` until the sender closes it."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(FLIGHT)

    async def deliver() -> None:
        gone = False  # the receiving end closed (e.g. a label party killed mid-run)
        while (item := await queue.get()) is not None:
            at, chunk = item
            if not gone and (wait := at - loop.time()) > 0:
                await asyncio.sleep(wait)
            gone = gone or writer.is_closing()
            if gone:  # drop the chunk, but keep taking them: the sender must never block
                continue
            try:
                writer.write(chunk)
                await writer.drain()
            except (ConnectionError, RuntimeError):  # uvloop: RuntimeError on a closed handle
                gone = True
        if not gone and not writer.is_closing() and writer.can_write_eof():
            writer.write_eof()

    delivering = asyncio.ensure_future(deliver())
    try:
        while chunk := await reader.read(CHUNK):
            await queue.put((link.arrival(loop.time(), len(chunk)), chunk))
    except ConnectionError:
        pass
    finally:
        await queue.put(None)
        with contextlib.suppress(ConnectionError):
            await delivering


class Relay:
    """Accepts connections on `listen` and carries each to `target` over two shaped links."""

    def __init__(self, target: str, network: NetworkConfig, seed: int = 0) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.network = network
        self.seed = seed
        self.connections = 0
        self.open = 0
        self.refusals = RefusalLog(log)

    def carried(self) -> str:
        return f"{self.connections} connection(s) carried, {self.open} open"

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_CONNECTIONS:
            self.refusals.refused(f"a connection from {writer.get_extra_info('peername')}",
                                  f"{MAX_CONNECTIONS} connections are open already (one party's "
                                  "link needs one)", "closed")
            writer.close()
            return
        self.open += 1
        cut = False  # by the relay's stop: still open in the line that says how many it cut
        try:
            await self._carry(reader, writer)
        except asyncio.CancelledError:  # the relay stops (Ctrl-C) while it holds or carries one:
            cut = True  # ended here, or Python 3.11's stream server logs it as a traceback
            writer.close()
        finally:
            if not cut:
                self.open -= 1

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        seed = self.seed * 1_000 + self.connections
        upstream = await self._reach(reader)
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer, early = upstream
        up_writer.write(early)  # what the party sent while the label party was not listening
        try:
            await asyncio.gather(_carry(reader, up_writer, Link.of(self.network, 2 * seed)),
                                 _carry(up_reader, writer, Link.of(self.network, 2 * seed + 1)))
        finally:
            for w in (writer, up_writer):
                w.close()

    async def _reach(self, reader: asyncio.StreamReader
                     ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes] | None:
        """A connection to the label party, and what the party sent meanwhile; None if the
        party left, or the label party did not listen within UPSTREAM_WAIT. Until it listens
        the party's connection is held open, as a label party not yet started looks to a
        party without a relay (it waits): closing it made every party that connected first
        read a TLS or certificate refusal and quit."""
        loop = asyncio.get_running_loop()
        end = loop.time() + UPSTREAM_WAIT
        early = bytearray()
        waiting = False
        while True:
            try:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
                if waiting:
                    log.info("%s:%d listens now: carrying the held connection", self.host,
                             self.port)
                return up_reader, up_writer, bytes(early)
            except OSError as err:
                if loop.time() >= end:
                    log.warning("cannot reach %s:%d within %g s: %s; closing the party's "
                                "connection", self.host, self.port, UPSTREAM_WAIT, err)
                    return None
                if not waiting:
                    log.info("cannot reach %s:%d yet (%s): holding the party's connection "
                             "until it listens (up to %g s)", self.host, self.port,
                             err.strerror or err, UPSTREAM_WAIT)
                    waiting = True
            if len(early) >= CHUNK:  # a party says little before an answer: wait, read no more
                await asyncio.sleep(UPSTREAM_RETRY)
                continue
            try:
                chunk = await asyncio.wait_for(reader.read(CHUNK), UPSTREAM_RETRY)
            except TimeoutError:
                continue
            except ConnectionError:
                return None
            if not chunk:  # the party gave up on this connection
                return None
            early += chunk

    async def serve(self, listen: str, port_file: Path | None = None) -> None:
        host, port = listen.rsplit(":", 1)
        server = await asyncio.start_server(self._connection, host, int(port))
        bound = f"{host}:{server.sockets[0].getsockname()[1]}"
        n = self.network
        log.info("relaying %s -> %s:%d: one-way latency %g ms, jitter %g ms, bandwidth %s", bound,
                 self.host, self.port, n.one_way_latency_ms, n.jitter_ms,
                 f"{n.bandwidth_mbit:g} Mbit/s" if n.bandwidth_mbit else "unlimited")
        if port_file is not None:
            try:
                write_atomically(port_file, lambda tmp: tmp.write_text(bound))
            except OSError as err:  # listening worked: say what did not
                server.close()
                raise PortFileError(f"cannot write --port-file {port_file}: "
                                    f"{err.strerror or err} (listening on {bound} worked; "
                                    "give a file in a writable directory)") from None
        async with server:
            await server.serve_forever()


def link_seed(run_seed: int, party_id: int) -> int:
    """The jitter seed of party k's relay: the same under `splitleak run` and compose."""
    return run_seed * 100 + party_id


def _link(args: argparse.Namespace) -> tuple[NetworkConfig, int]:
    """The options' link, or the experiment's [network] with --config (ValueError: why not)."""
    options = {"--latency-ms": args.latency_ms, "--jitter-ms": args.jitter_ms,
               "--bandwidth-mbit": args.bandwidth_mbit, "--seed": args.seed}
    if args.config is None:
        if args.party_id is not None:
            raise ValueError("--party-id only applies with --config")
        if args.seed is not None and args.seed < 0:
            raise ValueError(f"--seed must be 0 or more (it seeds the jitter), got {args.seed}")
        return NetworkConfig(one_way_latency_ms=args.latency_ms or 0.0,
                             jitter_ms=args.jitter_ms or 0.0,
                             bandwidth_mbit=args.bandwidth_mbit), args.seed or 0
    given = [name for name, value in options.items() if value is not None]
    if given:
        raise ValueError(f"--config takes the link from the experiment's [network]; drop "
                         f"{', '.join(given)}")
    cfg = load_config(args.config)
    parties = cfg.topology.passive_parties
    if args.party_id is None or not 1 <= args.party_id <= parties:
        raise ValueError(f"--config needs --party-id 1..{parties} (the experiment's passive "
                         f"parties), got {args.party_id}")
    return cfg.network, link_seed(cfg.run.seed, args.party_id)


# The flag that sets each NetworkConfig field (an error names the flag the user typed).
FLAGS = {"one_way_latency_ms": "--latency-ms", "jitter_ms": "--jitter-ms",
         "bandwidth_mbit": "--bandwidth-mbit"}


def cmd_relay(args: argparse.Namespace) -> int:
    setup_logging("relay")
    try:
        network, seed = _link(args)
    except ValidationError as err:  # each field as the flag that set it
        text = format_validation_error(err, "relay options", "link")
        for field, flag in FLAGS.items():
            text = text.replace(f"\n  {field}: ", f"\n  {flag}: ")
        log.error("%s", text)
        return EXIT_BAD_INPUT
    except (ValueError, ConfigError) as err:
        log.error("relay: %s", err)
        return EXIT_BAD_INPUT
    try:  # --listen and --to are HOST:PORT (or @FILE) by their argparse types
        check_address_file(args.port_file, "--port-file")
        args.to = check_peer(resolve_now(args.to, "label party", TO_DEADLINE), "--to")
    except AddressError as err:  # the label party may still be starting: it did not in time
        log.error("relay: %s", err)
        return EXIT_FAILED
    except ValueError as err:
        log.error("relay: %s", err)
        return EXIT_BAD_INPUT
    relay = Relay(args.to, network, seed)
    say_when_terminated(lambda: f"relay: stopped by SIGTERM ({relay.carried()})", log)
    try:
        run_async(relay.serve(args.listen, args.port_file))
    except PortFileError as err:
        log.error("relay: %s", err)
        return EXIT_BAD_INPUT
    except OSError as err:  # the operating system's reason, as the roles word it
        log.error("relay: cannot listen on %s: %s", args.listen,
                  why_not_listening(args.listen) or err)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        log.warning("relay: stopped by Ctrl-C (%s)", relay.carried())
        return EXIT_INTERRUPTED
    return 0


