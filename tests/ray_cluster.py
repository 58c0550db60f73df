"""A real multi-node Ray cluster (ray.cluster_utils) started from a fresh process, for tests.

Ray forks its daemons with a Python preexec_fn. Forked from the pytest process, which has
gRPC threads left by the tests before, the raylet could hang before exec (CI saw the head's
raylet never start). A fresh helper process has no such threads; the daemons fate-share with
it, so killing it after a failed start leaves nothing behind, and the start is retried.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from splitleak.fileio import write_atomically


class ClusterStartError(RuntimeError):
    """The cluster did not come up in any attempt."""


def _serve(nodes: int, cpus: int, object_store: int, ready: Path) -> None:
    """In the helper: start the nodes, write the address, hold them until stdin closes."""
    from ray.cluster_utils import Cluster

    args = {"num_cpus": cpus, "object_store_memory": object_store}
    cluster = Cluster(initialize_head=True, head_node_args=args)
    for _ in range(nodes - 1):
        cluster.add_node(**args)
    cluster.wait_for_nodes(timeout=120)
    write_atomically(ready, lambda tmp: tmp.write_text(json.dumps({"address": cluster.address})))
    sys.stdin.read()
    cluster.shutdown()


def _kill_group(helper: subprocess.Popen) -> None:
    """Kill the helper and every daemon it started (they share its process group)."""
    try:
        os.killpg(helper.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    helper.wait()


@contextmanager
def ray_cluster(nodes: int, cpus: int = 1, object_store: int = 80 * 1024 * 1024,
                attempts: int = 3, patience_s: float = 240.0) -> Iterator[str]:
    """Yield the GCS address of a running ``nodes``-node cluster; shut it down on exit."""
    failures = []
    for attempt in range(1, attempts + 1):
        with tempfile.TemporaryDirectory(prefix="splitleak-raytest-") as scratch:
            ready = Path(scratch) / "ready.json"
            log = Path(scratch) / "helper.log"
            with log.open("w") as sink:
                helper = subprocess.Popen(
                    [sys.executable, "-m", "tests.ray_cluster", str(nodes), str(cpus),
                     str(object_store), str(ready)],
                    stdin=subprocess.PIPE, stdout=sink, stderr=subprocess.STDOUT,
                    cwd=Path(__file__).resolve().parents[1], start_new_session=True)
            deadline = time.monotonic() + patience_s
            while not ready.exists() and helper.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if ready.exists():
                try:
                    yield json.loads(ready.read_text())["address"]
                finally:
                    helper.stdin.close()
                    try:
                        helper.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        pass
                    _kill_group(helper)  # and whatever it left running
                return
            _kill_group(helper)
            tail = log.read_text(errors="replace")[-2000:]
            failures.append(f"attempt {attempt}: exit {helper.returncode}, last output:\n{tail}")
    raise ClusterStartError(f"the {nodes}-node Ray cluster did not start in {attempts} attempts:\n"
                            + "\n".join(failures))


if __name__ == "__main__":  # the helper: NODES CPUS OBJECT_STORE READY_FILE
    _serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
