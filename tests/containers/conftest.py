"""Container fixtures: a Docker engine and compose tool (or a skip saying why), the image
built once per session (offline when no registry is reachable), one compose project per test
removed afterwards, pass or fail.

Environment:
  SPLITLEAK_COMPOSE      compose command, e.g. "docker compose" or "docker-compose"
                         (default: v2 plugin if present, else docker-compose)
  SPLITLEAK_BUILD        auto (default) | online | offline
  SPLITLEAK_TEST_IMAGE   use this image as is, no build (iterating on the tests)
  SPLITLEAK_CONTAINER_TESTS=0   skip these tests
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers.harness import (
    COMPOSE_FILE,
    OFFLINE_BASE,
    ONLINE_BASE,
    REPO,
    TEST_IMAGE,
    WHEELS,
    Topology,
    detect_compose,
    last_line,
    run,
)

BUILD_TIMEOUT_S = 1800


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Remember each phase's report on the item, so a finalizer can tell a failed test."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture(scope="session")
def compose_command() -> list[str]:
    """The compose tool, after making sure an engine answers (else the test is skipped)."""
    if os.environ.get("SPLITLEAK_CONTAINER_TESTS") == "0":
        pytest.skip("container tests disabled by SPLITLEAK_CONTAINER_TESTS=0")
    if shutil.which("docker") is None:
        pytest.skip("container tests skipped: no docker CLI installed (Debian: apt-get install "
                    "docker.io docker-compose)")
    try:
        info = run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=30)
    except subprocess.TimeoutExpired:
        pytest.skip("container tests skipped: `docker info` did not answer within 30 s")
    if info.returncode != 0:
        pytest.skip("container tests skipped: no Docker engine reachable "
                    f"({last_line(info.stderr or info.stdout)})")
    command = detect_compose()
    if command is None:
        pytest.skip("container tests skipped: a Docker engine runs but no compose tool was found "
                    "(tried `docker compose` and `docker-compose`; set SPLITLEAK_COMPOSE)")
    return command


def _registry_reachable() -> bool:
    if run(["docker", "image", "inspect", ONLINE_BASE]).returncode == 0:
        return True
    try:
        return run(["docker", "pull", ONLINE_BASE], timeout=180).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _build_env() -> tuple[str, dict[str, str]]:
    """Which build (online/offline) and the compose variables that select it."""
    mode = os.environ.get("SPLITLEAK_BUILD", "auto")
    if mode not in ("auto", "online", "offline"):
        pytest.fail(f"SPLITLEAK_BUILD={mode!r}: use auto, online or offline")
    if mode == "auto":
        mode = "online" if _registry_reachable() else "offline"
    if mode == "online":
        return mode, {"SPLITLEAK_BASE_IMAGE": ONLINE_BASE, "SPLITLEAK_WHEELS": ""}
    check = run([str(REPO / "deploy" / "prepare_offline.sh"), "--check"], cwd=REPO,
                env={**os.environ, "SPLITLEAK_BASE_IMAGE": OFFLINE_BASE})
    if check.returncode != 0:
        pytest.skip("container tests skipped: no registry reachable and the offline build is "
                    f"not prepared ({last_line(check.stderr or check.stdout)})")
    return mode, {"SPLITLEAK_BASE_IMAGE": OFFLINE_BASE, "SPLITLEAK_WHEELS": WHEELS}


@pytest.fixture(scope="session")
def image(compose_command: list[str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The splitleak image, built once per session through the compose file's build section."""
    given = os.environ.get("SPLITLEAK_TEST_IMAGE")
    if given:
        if run(["docker", "image", "inspect", given]).returncode != 0:
            pytest.fail(f"SPLITLEAK_TEST_IMAGE={given} does not exist")
        return given
    mode, env = _build_env()
    log = tmp_path_factory.mktemp("build") / "build.log"
    started = time.monotonic()
    with log.open("w") as out:
        result = subprocess.run(
            [*compose_command, "-p", "splitleak-build", "-f", str(COMPOSE_FILE), "build", "prepare"],
            stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=False,
            env={**os.environ, **env, "SPLITLEAK_IMAGE": TEST_IMAGE}, cwd=REPO)
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        pytest.fail(f"{mode} image build failed (exit {result.returncode}); log {log}:\n{tail}")
    size = run(["docker", "image", "inspect", "-f", "{{.Size}}", TEST_IMAGE]).stdout.strip()
    print(f"\nbuilt {TEST_IMAGE} ({mode}) in {time.monotonic() - started:.0f} s, "
          f"{int(size) / 2**30:.2f} GiB")
    return TEST_IMAGE


@pytest.fixture
def topology(request: pytest.FixtureRequest, compose_command: list[str], image: str,
             tmp_path: Path) -> Iterator[Topology]:
    """A fresh compose project on deploy/docker-compose.yml, its runs under tmp_path;
    `down -v --remove-orphans` afterwards, with every container's log shown on failure."""
    project = f"sltest{uuid.uuid4().hex[:10]}"
    runs = tmp_path / "runs"
    runs.mkdir()
    uid = os.getuid() if os.getuid() != 0 else 1000  # root on the host: the image's user
    gid = os.getgid() if os.getuid() != 0 else 1000
    env = {**os.environ,
           "SPLITLEAK_IMAGE": image,
           "SPLITLEAK_RUNS": str(runs),
           "SPLITLEAK_RUN_ID": f"run-{project}",
           "SPLITLEAK_UID": str(uid),
           "SPLITLEAK_GID": str(gid)}
    env.pop("SPLITLEAK_CONFIG", None)
    topo = Topology(compose_command, project, env, runs, env["SPLITLEAK_RUN_ID"],
                    tmp_path / "compose.log")
    topo.log.touch()
    try:
        yield topo
    finally:
        failed = any(getattr(getattr(request.node, f"report_{phase}", None), "failed", False)
                     for phase in ("setup", "call"))
        if failed:
            print(f"\n--- compose output ({topo.log}) ---\n{topo.output(200)}")
            print(f"\n--- container logs of {project} ---\n{topo.all_logs()[-20000:]}")
        topo.down()
        leftovers = run(["docker", "ps", "-aq", "--filter",
                         f"label=com.docker.compose.project={project}"]).stdout.split()
        networks = run(["docker", "network", "ls", "-q", "--filter",
                        f"label=com.docker.compose.project={project}"]).stdout.split()
        assert not leftovers and not networks, (
            f"compose down left containers {leftovers} / networks {networks} of {project}")
