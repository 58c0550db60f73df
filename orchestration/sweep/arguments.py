"""The options of `splitleak sweep` and of every command that runs points on an engine (light:
the CLI builds its parser from these without importing torch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from splitleak.arguments import ray_address, writable_dir

ENGINES = ("local", "inprocess", "ray")
MAX_CPUS_PER_ROLE = 64


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every command that runs points on an engine shares (sweep, gafm-select)."""
    parser.add_argument("--engine", choices=ENGINES, default="local",
                        help="local: each point's parties as processes on this machine, talking "
                        "gRPC (default); inprocess: each point trained by the in-process reference "
                        "(the same numbers, no processes or sockets per party); ray: a Ray cluster")
    parser.add_argument("--jobs", type=int, help="points at a time (default local and inprocess: "
                        "the cores this process may use; ray: what the cluster's CPUs hold); "
                        "inprocess --jobs 1 runs them one after another in this process")
    parser.add_argument("--address", type=ray_address,
                        help="ray: the cluster, HOST:PORT, ray://HOST:PORT or auto (default: "
                        "RAY_ADDRESS, else a Ray instance started on this machine)")
    parser.add_argument("--spread", action="store_true",
                        help="ray: STRICT_SPREAD, every role of a point on a different node "
                        "(default PACK)")
    parser.add_argument("--cpus-per-role", type=float, metavar="X",
                        help="ray: CPUs each role of a point reserves, more than 0 and at most "
                        f"{MAX_CPUS_PER_ROLE} (default 1; e.g. 0.5 runs a point of 4 roles on 2 CPUs)")
    parser.add_argument("--shared-dir", type=writable_dir,
                        help="ray: an output directory every node mounts at this same path; roles "
                        "write run directories there (default: streamed back to this machine)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="sweep file (TOML)")
    add_engine_arguments(parser)
    parser.add_argument("--retry-failed", action="store_true",
                        help="run the points that failed before again (default: keep their failure)")
    parser.add_argument("--output-dir", type=writable_dir, help="override sweep.output_dir")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--no-compare", action="store_true", help="do not write compare/ afterwards")
