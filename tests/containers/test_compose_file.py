"""deploy/docker-compose.yml is exactly what deploy/make_compose.py writes for 2 parties, the
generator wires N parties right, and the compose tool accepts what it writes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.containers.harness import COMPOSE_FILE, REPO, detect_compose, run


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_compose", REPO / "deploy" / "make_compose.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_file_is_the_generated_one() -> None:
    expected = generator().render(2, "deploy/docker-compose.yml")
    assert COMPOSE_FILE.read_text() == expected, (
        "deploy/docker-compose.yml differs from the generator's output; regenerate it with "
        "`python deploy/make_compose.py 2 -o deploy/docker-compose.yml`")


@pytest.mark.parametrize("n", [1, 3, 8])
def test_generator_wires_n_passive_parties(n: int) -> None:
    services = generator().compose(n)["services"]
    passive = [f"passive-party-{k}" for k in range(1, n + 1)]
    assert [s for s in services if s.startswith("passive-party-")] == passive
    for k, name in enumerate(passive, start=1):
        command = services[name]["command"]
        assert command[command.index("--party-id") + 1] == str(k)
        assert ("--attacker" in command) == (k == 1), name  # only party 1 is tapped
        assert services[name]["depends_on"]["label-party"] == {"condition": "service_healthy"}
    assert set(services["analysis"]["depends_on"]) == {"label-party", "attacker", *passive}
    assert services["prepare"]["environment"]["SPLITLEAK_PASSIVE_PARTIES"] == str(n)
    assert [s for s in services if "build" in services[s]] == ["prepare"]  # one image, built once


def test_generator_refuses_bad_n() -> None:
    result = subprocess.run([sys.executable, str(REPO / "deploy" / "make_compose.py"), "0"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "1..64" in result.stderr


@pytest.mark.containers
@pytest.mark.parametrize("n", [1, 2, 5])
def test_compose_tool_accepts_generated_files(n: int, tmp_path: Path) -> None:
    compose = detect_compose()
    if compose is None:
        pytest.skip("no compose tool (docker compose / docker-compose) installed")
    path = tmp_path / f"compose.{n}.yml"
    path.write_text(generator().render(n, str(path)))
    result = run([*compose, "-f", str(path), "config", "-q"])
    assert result.returncode == 0, result.stderr
    listed = run([*compose, "-f", str(path), "config", "--services"]).stdout.split()
    assert sorted(listed) == sorted(["prepare", "label-party", "attacker", "analysis", "report",
                                     *(f"passive-party-{k}" for k in range(1, n + 1))])
