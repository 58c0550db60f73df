"""One launch plan: `splitleak run`, the Ray engine and the compose generator start the same
roles, in an order where each role's servers come first, with the same taps."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from orchestration.launch import (
    LABEL_PARTY,
    SIDECAR,
    Topology,
    launch_plan,
    roles,
    start_order,
    topology_of,
)
from splitleak.artifacts.paths import RunDir
from splitleak.config import parse_config
from tests.conftest import small_config

REPO = Path(__file__).resolve().parent.parent


def keys(plan: list) -> list[str]:
    return [role.key for role in plan]


def test_the_plan_names_every_role_with_its_taps() -> None:
    plan = roles(Topology(3, tapped=frozenset({2}), shaped=True))
    assert keys(plan) == ["label_party", "attacker", "relay_1", "passive_party_1", "relay_2",
                          "passive_party_2", "relay_3", "passive_party_3"]
    by_key = {role.key: role for role in plan}
    assert by_key["passive_party_2"].taps == SIDECAR and by_key["passive_party_1"].taps is None
    assert by_key["passive_party_3"].reaches == "relay_3"
    assert by_key["relay_3"].reaches == LABEL_PARTY and not by_key["relay_3"].essential
    assert [r.service for r in plan[:3]] == ["label-party", "attacker", "relay-1"]
    assert keys(roles(Topology(2))) == ["label_party", "passive_party_1", "passive_party_2"]


def test_a_role_starts_after_the_servers_it_needs() -> None:
    """The label party taps what it receives: the sidecar must serve before it starts."""
    plan = roles(Topology(2, received=frozenset({1})))
    assert plan[0].taps == SIDECAR
    ordered = keys(start_order(plan))
    assert ordered.index("attacker") < ordered.index("label_party") < ordered.index("passive_party_1")
    plain = roles(Topology(2, tapped=frozenset({1})))
    assert start_order(plain) == plain


def test_a_local_run_launches_the_plan(tmp_path: Path) -> None:
    data = small_config(tmp_path)
    data["network"] = {"one_way_latency_ms": 5}
    cfg = parse_config(data)
    run = RunDir(tmp_path / "run")
    launches = launch_plan(cfg, run)
    assert [launch.name for launch in launches] == [
        role.name for role in roles(topology_of(cfg))]
    passive = next(launch for launch in launches if launch.name == "passive party 2")
    assert passive.args[passive.args.index("--label-party") + 1] == f"@{run.relay_address(2)}"
    relay = next(launch for launch in launches if launch.name == "relay 2")
    assert relay.serves and not relay.essential and relay.log == "relay_2.log"
    assert relay.args[relay.args.index("--to") + 1] == f"@{run.label_party_address}"
    routed = launch_plan(cfg, run, routed=True)
    assert f"@{run.routed_address}" in next(r for r in routed if r.name == "relay 1").args


def _make_compose() -> Any:
    spec = importlib.util.spec_from_file_location("make_compose", REPO / "deploy" / "make_compose.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_compose_file_written_outside_deploy_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`make_compose.py 12 -o /tmp/c12.yml` wrote a file whose build context (..), config
    (./experiment.toml) and runs (../runs) then named /, /tmp/experiment.toml and /runs."""
    module = _make_compose()
    for output, said in ((tmp_path / "c12.yml", f"write it in {REPO / 'deploy'}, the directory"),
                         (REPO / "deploy", "is a directory: name the file")):
        with pytest.raises(SystemExit) as exit_:
            module.main(["12", "-o", str(output)])
        assert exit_.value.code == 2
        message = capsys.readouterr().err
        assert f"-o {output}" in message and said in message, message
    assert not (tmp_path / "c12.yml").exists()


def test_the_compose_file_follows_the_plan() -> None:
    module = _make_compose()
    services = module.compose(3, wan=True)["services"]
    plan = roles(Topology(3, tapped=frozenset({1}), shaped=True))
    assert [s for s in services if s not in ("prepare", "analysis", "report")] == [
        role.service for role in plan]
    assert services["passive-party-1"]["depends_on"] == {
        "relay-1": {"condition": "service_started"}, "attacker": {"condition": "service_healthy"}}
    assert "--attacker" not in services["passive-party-2"]["command"]
