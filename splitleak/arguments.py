"""argparse types that refuse a bad argument before any work runs: exit 2, naming the option
and what is allowed (bounded numbers, seeds, devices, addresses, output paths)."""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from splitleak.config import DEVICE, TopologyConfig

SEED_LIMIT = 2**63  # seeds are in [0, 2**63), as in the config's run.seed
# HOST:PORT, HOST a name, an IPv4 address or a bracketed IPv6 one ([::] listens on every interface)
HOST_PORT = r"^(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):\d{1,5}$"


def config_bound(model: type[BaseModel], field: str) -> int:
    """The upper bound (`le`) the config puts on `model.field`, e.g. 64 passive parties."""
    return next(m.le for m in model.model_fields[field].metadata if getattr(m, "le", None))


MAX_PARTIES = config_bound(TopologyConfig, "passive_parties")


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (else exit 2 naming what is allowed)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; allowed: "
                                             f"{low}..{high}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value
    return parse


def seed(text: str) -> int:
    """An argparse type: a seed in [0, 2**63), the config's range."""
    return int_in(0, SEED_LIMIT - 1)(text)


def float_in(low: float, high: float = math.inf, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high], or (low, high] when `low_open`."""
    allowed = f"{'(' if low_open else '['}{low:g}, {high:g}]" if math.isfinite(high) else \
        f"{'>' if low_open else '>='} {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number {allowed}")
        if value < low or (low_open and value == low) or value > high:
            raise argparse.ArgumentTypeError(f"{text} is out of range; allowed: {allowed}")
        return value
    return parse


def device(text: str) -> str:
    """An argparse type: a device as run.device takes it (whether this host has it: later)."""
    if not re.match(DEVICE, text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; allowed: auto, cpu, cuda, "
                                         "cuda:K")
    return text


def host_port(lowest: int = 1, at_file: bool = False) -> Callable[[str], str]:
    """An argparse type: HOST:PORT with a port in [lowest, 65535] (0: a listen address's any
    free port); with `at_file`, also @FILE (the address a process writes there)."""
    def parse(text: str) -> str:
        if at_file and len(text) > 1 and text.startswith("@"):
            return text
        if not re.match(HOST_PORT, text):
            raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:50051)"
                                             + (" or @FILE" if at_file else ""))
        port = int(text.rsplit(":", 1)[1])
        if not lowest <= port <= 65535:
            raise argparse.ArgumentTypeError(f"port {port} of {text!r} is not a TCP port to "
                                             f"{'listen on' if lowest == 0 else 'connect to'} "
                                             f"({lowest}..65535)")
        return text
    return parse


def ray_address(text: str) -> str:
    """An argparse type: a Ray cluster as ray.init takes one: HOST:PORT, ray://HOST:PORT, auto."""
    if text == "auto":
        return text
    try:
        host_port()(text.removeprefix("ray://"))
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err}; allowed: HOST:PORT, ray://HOST:PORT or auto") \
            from None
    return text


def _nearest_existing(path: Path) -> Path:
    while _lookup_problem(path) is None and not path.exists() and path != path.parent:
        path = path.parent
    return path


def _lookup_problem(path: Path) -> str | None:
    """Why `path` cannot even be looked up, in the system's words (a name longer than its file
    system allows, a folder this user may not search), None when it can."""
    try:
        path.exists()
    except OSError as err:
        return f"cannot be looked up: {err.strerror or err}"
    return None


def not_a_directory(path: Path) -> str:
    """Why an existing `path` cannot hold files, e.g. `x is a file, not a directory`."""
    return f"{path} is {'a file, not' if path.is_file() else 'not'} a directory"


def parent_problem(path: Path) -> str | None:
    """Why no file can be made at `path` because a directory above it is a file (None: none is)."""
    existing = _nearest_existing(path.parent)
    return None if existing.is_dir() else not_a_directory(existing)


def output_dir_problem(path: Path) -> str | None:
    """Why a directory could not be made and written at `path`, in a few words (None: it can)."""
    if (problem := _lookup_problem(path)) is not None:
        return problem
    existing = _nearest_existing(path)
    if not existing.is_dir():
        return not_a_directory(existing)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-test-", dir=existing))
    except OSError as err:
        return f"cannot create a directory in {existing}: {err.strerror or err}"
    return None


def writable_dir(text: str) -> Path:
    """An argparse type: a directory this process can create (if need be) and write in."""
    problem = output_dir_problem(Path(text))
    if problem is not None:
        raise _refusal(Path(text), problem)
    return Path(text)


def writable_file(text: str) -> Path:
    """An argparse type: a file this process can write, in a directory that exists."""
    path = Path(text)
    existing = _nearest_existing(path.parent)
    problem: str | None
    if (problem := _lookup_problem(path)) is not None:
        pass
    elif path.is_dir():
        problem = "is a directory; give a file name"
    elif not existing.is_dir():
        problem = not_a_directory(existing)
    elif existing != path.parent:
        problem = f"directory {path.parent} does not exist"
    elif path.exists() and not os.access(path, os.W_OK):
        problem = "is not writable"
    else:
        problem = output_dir_problem(path.parent)
    if problem is not None:
        raise _refusal(path, problem)
    return path


def _refusal(path: Path, problem: str) -> argparse.ArgumentTypeError:
    """`problem` about `path`, naming the path once."""
    return argparse.ArgumentTypeError(problem if problem.startswith(f"{path} ") else
                                      f"{path} {problem}" if problem.startswith("is ") else
                                      f"{path}: {problem}")
