"""What the container tests share: the compose tool, the ways to run the topology, and a
handle on one compose project (its containers, logs and run directory)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
ONLINE_BASE = "python:3.11-slim"
OFFLINE_BASE = os.environ.get("SPLITLEAK_BASE_IMAGE", "splitleak-base:bookworm")
WHEELS = "deploy/wheels"
TEST_IMAGE = "splitleak:test"


def run(args: list[str], timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False,
                          **kwargs)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def detect_compose() -> list[str] | None:
    """SPLITLEAK_COMPOSE, else the v2 plugin, else Debian's docker-compose; None if none runs."""
    chosen = os.environ.get("SPLITLEAK_COMPOSE")
    candidates = [shlex.split(chosen)] if chosen else [["docker", "compose"], ["docker-compose"]]
    for command in candidates:
        if shutil.which(command[0]) and run([*command, "version"]).returncode == 0:
            return command
    return None


def up_commands(command: list[str] | None) -> dict[str, list[str]]:
    """The README's ways to run the topology to its end with this compose tool, by name."""
    ways = {"exit-code-from-report": ["up", "--no-build", "--exit-code-from", "report", "report"]}
    if command is None:
        return ways
    version = tuple(int(part) for part in re.findall(r"\d+", run(
        [*command, "version", "--short"]).stdout)[:2] or (0, 0))
    if version[0] == 1:  # 1.29's `up` attaches only once `report` started: after the analysis
        ways["abort-on-container-exit"] = ["up", "--no-build", "--abort-on-container-exit"]
    elif version >= (2, 27):  # v2 would stop everything at the first party's exit 0
        ways["abort-on-container-failure"] = ["up", "--no-build", "--abort-on-container-failure"]
    return ways


@dataclass
class Topology:
    """One compose project of the test: its own containers, network and runs directory."""

    compose: list[str]
    project: str
    env: dict[str, str]
    runs: Path
    run_id: str
    log: Path
    compose_file: Path = COMPOSE_FILE  # e.g. deploy/docker-compose.wan.yml

    @property
    def run_dir(self) -> Path:
        return self.runs / self.run_id

    def command(self, *args: str) -> list[str]:
        return [*self.compose, "-p", self.project, "-f", str(self.compose_file), *args]

    def start(self, *args: str) -> subprocess.Popen:
        """Start a compose command in the background, its output appended to self.log."""
        with self.log.open("a") as out:
            out.write(f"$ {' '.join(self.command(*args))}\n")
            out.flush()
            return subprocess.Popen(self.command(*args), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.env, cwd=REPO)

    def run(self, *args: str, timeout: float) -> int:
        process = self.start(*args)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"`{' '.join(args)}` did not finish within {timeout:g} s; "
                        f"output:\n{self.output()}")

    def output(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def container(self, service: str) -> str:
        """The id of the service's (single) container, running or exited."""
        ids = run(["docker", "ps", "-aq",
                    "--filter", f"label=com.docker.compose.project={self.project}",
                    "--filter", f"label=com.docker.compose.service={service}"]).stdout.split()
        assert len(ids) == 1, f"expected one {service} container, found {ids}"
        return ids[0]

    def state(self, service: str) -> dict[str, Any]:
        out = run(["docker", "inspect", "-f", "{{json .State}}", self.container(service)])
        return json.loads(out.stdout)

    def timeline(self, services: list[str]) -> str:
        """When each service's container ran, in seconds from the first start."""
        spans = {}
        for service in services:
            state = self.state(service)
            spans[service] = [datetime.fromisoformat(state[key][:26].rstrip("Z"))
                              for key in ("StartedAt", "FinishedAt")]
        zero = min(start for start, _ in spans.values())
        return ", ".join(f"{name} {(a - zero).total_seconds():.0f}-{(b - zero).total_seconds():.0f} s"
                         for name, (a, b) in spans.items())

    def container_logs(self, service: str) -> str:
        out = run(["docker", "logs", self.container(service)])
        return out.stdout + out.stderr

    def all_logs(self) -> str:
        out = run(self.command("logs", "--no-color"), timeout=120, env=self.env, cwd=REPO)
        return out.stdout + out.stderr

    def down(self) -> None:
        run(self.command("down", "-v", "--remove-orphans", "-t", "5"), timeout=300,
             env=self.env, cwd=REPO)


