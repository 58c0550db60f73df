"""Every gRPC channel and server option in one place: message limits, keepalive, credentials."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc

from splitleak import tls
from splitleak.config import TopologyConfig

PARTY_ID_KEY = "splitleak-party-id"
SESSION_KEY = "splitleak-session"
T = TypeVar("T")


def _options(max_message_mb: int) -> list[tuple[str, int]]:
    limit = max_message_mb * 1024 * 1024
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


def server_options(topology: TopologyConfig) -> list[tuple[str, int]]:
    # gRPC itself cuts off at twice the configured limit (bounding what a peer can make a
    # server allocate); between the two, splitleak.wire refuses with a status naming the limit.
    options = dict(_options(topology.max_message_mb))
    options["grpc.max_receive_message_length"] = 2 * topology.max_message_mb * 1024 * 1024
    return [*options.items(), ("grpc.so_reuseport", 0)]


def channel_options(topology: TopologyConfig) -> list[tuple[str, int]]:
    return _options(topology.max_message_mb) + [
        ("grpc.enable_retries", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


COMPRESSION = {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
               "deflate": grpc.Compression.Deflate}


def create_server(topology: TopologyConfig, compression: str = "none") -> grpc.aio.Server:
    return grpc.aio.server(options=server_options(topology), compression=COMPRESSION[compression])


class ListenError(OSError):
    """This process cannot listen on its address; the message names the address and why."""


def bind(server: grpc.aio.Server, address: str, tls_dir: Path | None = None,
         identity: str = "") -> int:
    """Listen on `address` (port 0 = any free port), with mutual TLS as `identity` when
    `tls_dir` is given; returns the bound port. ListenError names the address and why not."""
    check_listen(address)  # before gRPC, which prints its own lines to stderr when it cannot
    credentials = tls.server_credentials(tls_dir, identity) if tls_dir is not None else None
    try:
        port = (server.add_secure_port(address, credentials) if credentials is not None
                else server.add_insecure_port(address))
    except RuntimeError:  # grpc's "Failed to bind to address", without the reason
        port = 0
    if port == 0:
        raise ListenError(f"cannot listen on {address}: "
                          f"{why_not_listening(address) or 'gRPC could not bind it'}")
    return port


def check_listen(address: str) -> None:
    """ListenError naming `address` and the operating system's reason when this process cannot
    listen there (a port in use, an address not this host's), found without gRPC."""
    if (why := why_not_listening(address)) is not None:
        raise ListenError(f"cannot listen on {address}: {why}")


def why_not_listening(address: str) -> str | None:
    """The operating system's reason a server cannot listen on `address` (None: it can)."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1] -> ::1
    try:
        found = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        if host in ("0.0.0.0", "::"):  # gRPC's wildcard needs IPv4's port (IPv6's may be taken)
            _try_listen("0.0.0.0", int(port), socket.AF_INET, host == "::")
        else:
            _try_listen(host, int(port), found[0][0])  # an IPv6-only name too
    except socket.gaierror as err:  # e.g. name or service not known
        return err.strerror or str(err)
    except OSError as err:  # e.g. address already in use, cannot assign requested address
        return os.strerror(err.errno) if err.errno else str(err)
    except (ValueError, OverflowError):
        return "it is not HOST:PORT with a port in 0..65535"
    return None


def _try_listen(host: str, port: int, family: int, in_use_only: bool = False) -> None:
    """OSError when a socket cannot listen on (host, port); with `in_use_only`, only for a port
    in use (a family this host lacks is no reason)."""
    try:
        with socket.create_server((host, port), family=family):
            pass
    except OSError as err:
        if not in_use_only or err.errno == errno.EADDRINUSE:
            raise


def create_channel(address: str, topology: TopologyConfig, tls_dir: Path | None = None,
                   identity: str = "", server_identity: str | None = None,
                   compression: str = "none") -> grpc.aio.Channel:
    """A channel to `address`; over mutual TLS as `identity` when `tls_dir` is given, accepting
    only a server whose certificate names `server_identity` (when given); messages compressed
    with `compression` (none, gzip, deflate)."""
    if tls_dir is not None:
        options: list[tuple[str, Any]] = list(channel_options(topology))
        if server_identity is not None:
            options.append(tls.server_name_option(server_identity))
        return grpc.aio.secure_channel(address, tls.channel_credentials(tls_dir, identity),
                                       options=options, compression=COMPRESSION[compression])
    return grpc.aio.insecure_channel(address, options=channel_options(topology),
                                     compression=COMPRESSION[compression])


# What gRPC's UNAVAILABLE says when the connection was made but the TLS handshake refused:
# waiting longer cannot help (unlike "Connection refused", a server not listening yet).
_TLS_REFUSALS = ("handshake failed", "verification check failed", "certificate")


def tls_refusal(err: grpc.aio.AioRpcError) -> str | None:
    """Why a call failed in its TLS handshake (e.g. a server presenting another role's or
    another run's certificate), in gRPC's own words; None for any other failure."""
    details = err.details() or ""
    if err.code() != grpc.StatusCode.UNAVAILABLE or not any(
            marker in details.lower() for marker in _TLS_REFUSALS):
        return None
    return details.rsplit("last error: ", 1)[-1]


# A plaintext client's connection closed before any gRPC reply, this many attempts in a row:
# what a TLS server does with a client that never starts a handshake (a server that stopped
# would refuse the connections instead).
CLOSED_IN_A_ROW = 3


def closed_unanswered(err: grpc.aio.AioRpcError) -> bool:
    """The server accepted the connection and closed it without a gRPC reply."""
    return (err.code() == grpc.StatusCode.UNAVAILABLE
            and "socket closed" in (err.details() or "").lower())


def plaintext_against_tls(role: str, address: str) -> str:
    return (f"the {role} at {address} closes every plaintext connection: it speaks TLS, this "
            "party was started without it; give every party the same topology.tls")


def own_certificate_refused(role: str, address: str, tls_dir: Path, identity: str) -> str:
    """What a TLS client's connections closed unanswered, time after time, mean: the handshake
    completed on this side, then the server refused this client's certificate (another run's
    identity, or a certificate not signed by the CA the server trusts)."""
    return (f"the {role} at {address} closes every connection once the TLS handshake is done: "
            f"it refused this party's certificate {tls_dir / (identity + '.pem')} (not signed by "
            "the CA it trusts: another run's identity?); give every host ca.pem and its own "
            "pair from the same `splitleak certs DIR --parties N`")


def refused_server(refusal: str, role: str, address: str, flag: str,
                   tls_dir: Path | None = None) -> str:
    """One sentence for a TLS handshake (`tls_refusal`) that refused the server at `address`,
    dialled as this run's `role` (given by `flag`; this party's identities in `tls_dir`): its
    actual reason when gRPC's words show it, naming the CA file it was checked against."""
    lower = refusal.lower()
    if "wrong_version_number" in lower:  # a TLS client hello answered in plaintext
        return (f"the {role} at {address} speaks plaintext, this party was started with TLS: "
                "give every party the same topology.tls")
    if "expired" in lower or "not yet valid" in lower:
        return (f"the {role} at {address} presents a TLS certificate outside its validity "
                f"window ({refusal}): {tls.REMAKE}")
    ca = tls_dir / "ca.pem" if tls_dir is not None else "this run's ca.pem"
    if "hostname verification" in lower:  # signed by our CA, issued to another role
        return (f"the server at {address} is not this run's {role}: its TLS certificate, signed "
                f"by {ca}, is another role's ({refusal}); check {flag} (the {role}'s address)")
    return (f"the server at {address} is not this run's {role}: its TLS certificate is not "
            f"signed by {ca} ({refusal}); check {flag}, and that every host has ca.pem and its "
            "own pair from the same `splitleak certs DIR --parties N`")


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run an entry point's coroutine, on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
