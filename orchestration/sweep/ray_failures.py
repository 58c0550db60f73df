"""What the Ray engine says when no cluster answers at an address, the one there refuses the
driver, or a role's actor dies (text and sockets only: Ray itself is imported by
orchestration.sweep.ray_engine alone)."""

from __future__ import annotations

import os
import re
import socket
from typing import Any

# Each wait of a connection to a cluster, and how often ray.init tries: Ray's defaults (30 s a
# wait, 20 tries) keep a driver waiting minutes where no GCS answers; these, about 20 s in all.
CONNECT_TIMEOUT_S = 5
CONNECT_TRIES = 1


def bound_connect() -> None:
    """Make each try of ray.init to reach a cluster wait CONNECT_TIMEOUT_S, not Ray's 30 s; call
    it before Ray is imported, which reads this once (a value the user set wins)."""
    os.environ.setdefault("RAY_py_gcs_connect_timeout_s", str(CONNECT_TIMEOUT_S))


def unreachable(address: str) -> str | None:
    """Why nothing answers at HOST:PORT or ray://HOST:PORT (None: something listens there, or
    it is neither)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or "://" in host or not host:
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            return None
    except TimeoutError:
        return f"no answer within {CONNECT_TIMEOUT_S} s"
    except OSError as err:
        return err.strerror or type(err).__name__


def no_cluster(address: str, why: str, given: str = "--address") -> str:
    """Nothing answers at `address`, taken from `given` (--address, or RAY_ADDRESS)."""
    instead = ("leave --address out" if given == "--address"
               else "unset RAY_ADDRESS (and give no --address)")
    return (f"no Ray cluster answers at {given} {address} ({why}); give the GCS address "
            f"(HOST:PORT) of a running cluster, or {instead} to start one here")


def not_a_gcs(address: str, why: str, given: str = "--address") -> str:
    """Something listens at `address`, but no Ray GCS answers there (a dashboard's port, say)."""
    return (f"something listens at {given} {address}, but it does not answer as a Ray cluster "
            f"({why}); give the head node's GCS address (HOST:PORT, 6379 unless `ray start "
            "--head --port` said otherwise), or ray://HOST:PORT for a Ray Client server")


def refused(address: str, err: BaseException, given: str = "--address") -> str:
    """ray.init failed at a listening address: another token, not a GCS, a cluster that broke."""
    lines = str(err.__cause__ or err).strip().splitlines() or [type(err).__name__]
    detail = lines[-1].removeprefix("ray.exceptions.").split(". ", 1)[0].rstrip(".")
    if detail.startswith("Could not find any running Ray instance"):  # --address auto
        return no_cluster(address, "no Ray instance runs on this machine", given)
    return (f"the Ray cluster at {given} {address} refused this driver or did not answer "
            f"({detail}); check the address and, for a cluster with token authentication, run with "
            "RAY_AUTH_MODE=token and its token in ~/.ray/auth_token or RAY_AUTH_TOKEN")


def died(role: str, where: dict[str, Any] | None, ray_message: str) -> str:
    """One sentence naming the role whose actor died, where it ran, and Ray's reason."""
    where = where or {}
    pid = where.get("pid") or _field(ray_message, "pid")
    ip = where.get("ip") or _field(ray_message, "ip")
    node = " ".join(p for p in (where.get("node_id", "")[:8], f"at {ip}" if ip else "") if p)
    place = ", ".join(p for p in (f"on node {node}" if node else "", f"pid {pid}" if pid else "") if p)
    why = reason(ray_message)
    if where.get("node_id"):  # named already: Ray's 56 hex digits of it again say nothing more
        why = why.replace(f" Node Id: {where['node_id']}", "").rstrip(".")
    return f"{role} (Ray actor{' ' + place if place else ''}) died: {why}"


def reason(ray_message: str) -> str:
    """Ray's one-line reason in an ActorDiedError's text (without its list of common causes)."""
    lines = [line.strip() for line in ray_message.splitlines() if line.strip()]
    cause = next((line for line in lines[1:] if not line.startswith(tuple(_FIELDS))),
                 lines[0] if lines else "no reason given")
    detail = cause.split("Worker exit detail:", 1)[-1]
    return detail.split(" Some common causes", 1)[0].strip().rstrip(".") or cause


_FIELDS = ("class_name:", "actor_id:", "pid:", "name:", "namespace:", "ip:")


def _field(ray_message: str, name: str) -> str | None:
    found = re.search(rf"^\s*{name}: (\S+)\s*$", ray_message, re.MULTILINE)
    return found.group(1) if found else None
