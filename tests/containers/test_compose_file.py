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


WAN_FILE = REPO / "deploy" / "docker-compose.wan.yml"


def test_checked_in_wan_file_is_the_generated_one() -> None:
    expected = generator().render(2, "deploy/docker-compose.wan.yml", wan=True)
    assert WAN_FILE.read_text() == expected, (
        "deploy/docker-compose.wan.yml differs from the generator's output; regenerate it with "
        "`python deploy/make_compose.py 2 --wan -o deploy/docker-compose.wan.yml`")


@pytest.mark.parametrize("n", [1, 3])
def test_wan_variant_puts_a_relay_on_every_party_link(n: int) -> None:
    services = generator().compose(n, wan=True)["services"]
    plain = generator().compose(n)["services"]
    assert set(services) == set(plain) | {f"relay-{k}" for k in range(1, n + 1)}
    for k in range(1, n + 1):
        relay = services[f"relay-{k}"]["command"]
        assert relay[:2] == ["splitleak", "relay"]
        assert relay[relay.index("--to") + 1] == plain[f"passive-party-{k}"]["command"][
            plain[f"passive-party-{k}"]["command"].index("--label-party") + 1]
        assert relay[relay.index("--party-id") + 1] == str(k) and "--config" in relay
        listen = relay[relay.index("--listen") + 1].split(":", 1)[1]
        party = services[f"passive-party-{k}"]
        assert party["command"][party["command"].index("--label-party") + 1] == f"relay-{k}:{listen}"
        assert f"relay-{k}" in party["depends_on"]
        assert services[f"relay-{k}"]["depends_on"] == {"label-party": {"condition": "service_healthy"}}


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


@pytest.mark.parametrize(("n", "wan"), [(1, False), (2, False), (12, False), (2, True)])
def test_every_service_that_loads_the_dataset_reads_the_data_folder(n: int, wan: bool) -> None:
    """A config naming its own data (dataset.params.path = "/data/adult.data") ran nowhere in
    compose: no service mounted a data folder, so the label party exited 2, file not found."""
    module = generator()
    services = module.compose(n, wan)["services"]
    readers = {"prepare", "label-party", "attacker", "analysis",
               *(f"passive-party-{k}" for k in range(1, n + 1))}
    for name in readers:
        data = [v for v in services[name]["volumes"] if ":/data" in v]
        assert data == ["${SPLITLEAK_DATA:-./data}:/data:ro"], (name, services[name]["volumes"])
    assert "SPLITLEAK_DATA" in module.render(n, wan=wan).split("services:")[0]  # the settings
    assert (REPO / "deploy" / "data" / "README.md").is_file()  # the default folder is there


def test_generator_refuses_bad_n() -> None:
    result = subprocess.run([sys.executable, str(REPO / "deploy" / "make_compose.py"), "0"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "1..64" in result.stderr


@pytest.mark.containers
@pytest.mark.parametrize(("n", "wan"), [(1, False), (2, False), (5, False), (2, True)])
def test_compose_tool_accepts_generated_files(n: int, wan: bool, tmp_path: Path) -> None:
    compose = detect_compose()
    if compose is None:
        pytest.skip("no compose tool (docker compose / docker-compose) installed")
    path = tmp_path / f"compose.{n}.yml"
    path.write_text(generator().render(n, str(path), wan))
    result = run([*compose, "-f", str(path), "config", "-q"])
    assert result.returncode == 0, result.stderr
    listed = run([*compose, "-f", str(path), "config", "--services"]).stdout.split()
    assert sorted(listed) == sorted(["prepare", "label-party", "attacker", "analysis", "report",
                                     *(f"passive-party-{k}" for k in range(1, n + 1)),
                                     *(f"relay-{k}" for k in range(1, n + 1) if wan)])
