"""A run on the user's own data file in compose: the data folder (SPLITLEAK_DATA) is what the
containers read at /data, and `prepare` refuses a config whose data file is not there."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import tomli_w

from tests.containers.harness import REPO, Topology
from tests.test_datasets import ADULT_ROWS  # one >50K in four

pytestmark = [pytest.mark.containers, pytest.mark.timeout(1200)]

RUN_TIMEOUT_S = 600


def adult_config(tmp_path: Path, data_path: str) -> Path:
    """deploy/experiment.toml on the Adult file at `data_path` (inside the containers), a few
    steps long."""
    data = tomllib.loads((REPO / "deploy" / "experiment.toml").read_text())
    data["dataset"] = {"name": "adult", "params": {"path": data_path}}
    data["features"]["passive"] = [[0, 7], [7, 14]]  # Adult's 14 columns
    data["training"].update(epochs=2, eval_interval=8)
    config = tmp_path / "adult.toml"
    config.write_text(tomli_w.dumps(data))
    return config


def adult_file(folder: Path) -> Path:
    """A valid 300-row adult.data in `folder` (made), whose ages vary so that rows differ."""
    folder.mkdir()
    rows = []
    for i in range(300):
        fields = ADULT_ROWS[i % len(ADULT_ROWS)].split(", ")
        rows.append(", ".join([str(20 + i % 50), *fields[1:]]))
    path = folder / "adult.data"
    path.write_text("".join(row + "\n" for row in rows))
    return path


def test_a_run_reads_its_data_file_from_the_data_folder(topology: Topology, tmp_path: Path) -> None:
    data = adult_file(tmp_path / "data").parent
    topology.env["SPLITLEAK_DATA"] = str(data)
    topology.env["SPLITLEAK_CONFIG"] = str(adult_config(tmp_path, "/data/adult.data"))
    code = topology.run("up", "--no-build", "--exit-code-from", "report", "report",
                        timeout=RUN_TIMEOUT_S)
    assert code == 0, f"compose exited {code}:\n{topology.output()}"
    run_dir = topology.run_dir
    outcome = json.loads((run_dir / "label_party" / "outcome.json").read_text())
    assert outcome["status"] == "ok" and outcome["train_steps"] > 0, outcome
    resolved = tomllib.loads((run_dir / "config.toml").read_text())
    assert resolved["dataset"]["params"]["path"] == "/data/adult.data"
    assert "leak" in (run_dir / "report" / "report.md").read_text().lower()
    assert [p.name for p in data.iterdir()] == ["adult.data"]  # read-only: nothing written there


def test_prepare_refuses_a_data_file_missing_from_the_data_folder(topology: Topology,
                                                                 tmp_path: Path) -> None:
    topology.env["SPLITLEAK_CONFIG"] = str(adult_config(tmp_path, "/data/criteo/train.txt"))
    code = topology.run("up", "--no-build", "--exit-code-from", "prepare", "prepare",
                        timeout=RUN_TIMEOUT_S)
    assert code == 2, f"compose exited {code}:\n{topology.output()}"
    said = topology.container_logs("prepare")
    assert ("prepare: dataset.params.path = '/data/criteo/train.txt' does not exist inside the "
            "containers: put it as criteo/train.txt in the host folder SPLITLEAK_DATA (default "
            "deploy/data/), which the containers see at /data") in said, said
    assert "Traceback" not in said
    assert not topology.run_dir.exists()  # nothing made for a run that cannot start


def test_prepare_refuses_a_data_file_the_parties_cannot_read(topology: Topology,
                                                            tmp_path: Path) -> None:
    """prepare runs as root and read it; the label party, as SPLITLEAK_UID, then exited 2."""
    path = adult_file(tmp_path / "data")
    path.chmod(0)  # no one but root reads it, whoever owns it
    topology.env["SPLITLEAK_DATA"] = str(path.parent)
    topology.env["SPLITLEAK_CONFIG"] = str(adult_config(tmp_path, "/data/adult.data"))
    code = topology.run("up", "--no-build", "--exit-code-from", "prepare", "prepare",
                        timeout=RUN_TIMEOUT_S)
    assert code == 2, f"compose exited {code}:\n{topology.output()}"
    said = topology.container_logs("prepare")
    owner = f"{topology.env['SPLITLEAK_UID']}:{topology.env['SPLITLEAK_GID']}"
    assert (f"prepare: the parties' user {owner} (SPLITLEAK_UID/GID) cannot read the data file "
            "/data/adult.data (Permission denied): make it readable on the host") in said, said
    assert "Traceback" not in said
    assert not topology.run_dir.exists()
