"""What the services share about peer input: malformed messages as values, bounded echoes.

gRPC deserialises a request before any servicer code runs and answers a parse failure with
UNKNOWN (and ends a stream whose message is over its size limit as if the peer had closed
it). `add_service` registers a generated service with deserialisers that turn bytes which do
not parse, or are over the configured size, into a `Malformed` value instead: a unary call is
answered here (INVALID_ARGUMENT, RESOURCE_EXHAUSTED naming the limit), a streaming servicer
refuses the message in its own words.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

ECHO_LIMIT = 80  # characters of a peer's own value quoted back in an error
# A JoinRequest's config_sections / config_fields: entries, characters of a name, of a hash.
CONFIG_MAP_ENTRIES = 4096
CONFIG_NAME_CHARS = 200
CONFIG_HASH_CHARS = 64


@dataclass(frozen=True)
class Malformed:
    """Request bytes that are not a valid `message_type` (or too many of them)."""

    message_type: str
    error: str
    code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT

    def describe(self) -> str:
        if self.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return f"{self.message_type} message {self.error}"
        return f"malformed {self.message_type} message: {self.error}"


class RefusalLog:
    """Refusals logged at a bounded rate: the first `burst` of every `window` seconds one by
    one, then one line per window saying how many more there were (and the last), so a peer
    sending nothing but garbage can fill neither the disk nor the memory of a service."""

    def __init__(self, log: logging.Logger, burst: int = 20, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.burst, self.window, self.clock = log, burst, window, clock
        self.started = clock()
        self.logged = self.skipped = 0
        self.last = ""

    def refused(self, what: str, reason: str, code: str) -> None:
        if self.clock() - self.started >= self.window:
            self.flush()
        line = f"refused {what}: {reason} [{code}]"
        if self.logged < self.burst:
            self.logged += 1
            self.log.warning("%s", line)
        else:
            self.skipped += 1
            self.last = line[:500]

    def flush(self) -> None:
        """Say how many refusals were not logged one by one; start a new window."""
        if self.skipped:
            self.log.warning("%d more refusal(s) within %g s were not logged one by one; the last: "
                             "%s", self.skipped, self.window, self.last)
        self.started, self.logged, self.skipped = self.clock(), 0, 0


def oversized(size: int, limit_mb: int) -> str:
    return (f"of {size / (1 << 20):.1f} MiB is over the limit topology.max_message_mb = "
            f"{limit_mb} MiB")


def clip(text: str, limit: int) -> str:
    """A peer's free text for a message of ours, cut to `limit` characters."""
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """repr() of a peer-supplied value for an error message, cut to `limit` characters."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters as text"
    return f"{text[: limit - 1]}… ({size})"


def config_map_problem(field: str, hashes: Mapping[str, str]) -> str | None:
    """Why a map of config names to hashes (`field` of a JoinRequest) is more than a service
    reads, in words; None when within the bounds."""
    if len(hashes) > CONFIG_MAP_ENTRIES:
        return f"{field} has {len(hashes)} entries; at most {CONFIG_MAP_ENTRIES} are accepted"
    for name, digest in hashes.items():
        if len(name) > CONFIG_NAME_CHARS or not name.isprintable():
            return (f"{field} has the name {echo(name)}; a name is printable and at most "
                    f"{CONFIG_NAME_CHARS} characters")
        if len(digest) > CONFIG_HASH_CHARS:
            return (f"{field}[{echo(name)}] is {echo(digest)}; a hash is at most "
                    f"{CONFIG_HASH_CHARS} characters")
    return None


def _lenient(parse: Callable[[bytes], Any], limit_mb: int | None) -> Callable[[bytes], Any]:
    message_type = parse.__self__.DESCRIPTOR.full_name  # type: ignore[attr-defined]
    limit = None if limit_mb is None else limit_mb << 20

    def parse_or_mark(data: bytes) -> Any:
        if limit is not None and len(data) > limit:
            return Malformed(message_type, oversized(len(data), limit_mb or 0),
                             grpc.StatusCode.RESOURCE_EXHAUSTED)
        try:
            return parse(data)
        except (DecodeError, RuntimeError, ValueError) as err:
            return Malformed(message_type, str(err) or type(err).__name__)

    return parse_or_mark


def _refusing_unary(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await context.abort(request.code, request.describe())
        return await behaviour(request, context)

    return call


class _Captured:
    """Stands in for a server while a generated add_*_to_server registers its handlers."""

    def __init__(self) -> None:
        self.name = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
        self.name, self.handlers = name, handlers


def add_service(server: grpc.aio.Server, add_to_server: Callable[[Any, Any], None],
                servicer: Any, limit_mb: int | None = None) -> None:
    """Register `servicer` like the generated `add_to_server`, with lenient deserialisers:
    unary methods answer a malformed (or over `limit_mb`) request themselves; streaming
    methods receive `Malformed` items among the messages and must refuse them."""
    captured = _Captured()
    add_to_server(servicer, captured)
    handlers = {}
    for method, handler in captured.handlers.items():
        handler = handler._replace(
            request_deserializer=_lenient(handler.request_deserializer, limit_mb))
        if handler.unary_unary is not None:
            handler = handler._replace(unary_unary=_refusing_unary(handler.unary_unary))
        handlers[method] = handler
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(captured.name, handlers),))
    server.add_registered_method_handlers(captured.name, handlers)
