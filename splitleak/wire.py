"""What the services share about peer input: malformed messages as values, bounded echoes.

gRPC deserialises a request before any servicer code runs and answers a parse failure with
UNKNOWN. `add_service` registers a generated service with deserialisers that turn bytes
which do not parse into a `Malformed` value instead, so a unary call is answered with
INVALID_ARGUMENT here and a streaming servicer refuses the message in its own words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

ECHO_LIMIT = 80  # characters of a peer's own value quoted back in an error


@dataclass(frozen=True)
class Malformed:
    """Request bytes that are not a valid `message_type`."""

    message_type: str
    error: str

    def describe(self) -> str:
        return f"malformed {self.message_type} message: {self.error}"


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """repr() of a peer-supplied value for an error message, cut to `limit` characters."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 1]}… ({len(text)} characters)"


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    message_type = parse.__self__.DESCRIPTOR.full_name  # type: ignore[attr-defined]

    def parse_or_mark(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, RuntimeError, ValueError) as err:
            return Malformed(message_type, str(err) or type(err).__name__)

    return parse_or_mark


def _refusing_unary(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.describe())
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
                servicer: Any) -> None:
    """Register `servicer` like the generated `add_to_server`, with lenient deserialisers:
    unary methods answer a malformed request with INVALID_ARGUMENT themselves; streaming
    methods receive `Malformed` items among the messages and must refuse them."""
    captured = _Captured()
    add_to_server(servicer, captured)
    handlers = {}
    for method, handler in captured.handlers.items():
        handler = handler._replace(request_deserializer=_lenient(handler.request_deserializer))
        if handler.unary_unary is not None:
            handler = handler._replace(unary_unary=_refusing_unary(handler.unary_unary))
        handlers[method] = handler
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(captured.name, handlers),))
    server.add_registered_method_handlers(captured.name, handlers)
