"""Private keys and TLS directories (issue 26, items 3 and 7): a run's keys leave the disk as
soon as each process holds its own (so no run, even one whose orchestrator is killed with
SIGKILL, leaves one behind), the Ray engine never writes one to a node, Ray's own token is
private, and a --tls-dir that cannot be used is refused instead of serving plaintext."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest

from attacker.cli import main as attacker_main
from label_party.cli import main as label_party_main
from passive_party.cli import main as passive_party_main
from splitleak import tls
from splitleak.config import parse_config
from tests.conftest import scaled, small_config, write_config
from tests.runs import alive, cli, pids, run_dir, wait_for_step
from tests.test_cli_refusals import exit_code_and_text


def test_a_run_scoped_key_leaves_the_disk_once_loaded(tmp_path: Path) -> None:
    tls.generate(tmp_path, tls.identities(1), run_scoped=True)
    tls.claim(tmp_path, tls.LABEL_PARTY)
    assert not (tmp_path / "label-party.key").exists()
    assert (tmp_path / "attacker.key").exists()  # another process's, until it loads it
    for _ in range(2):  # served and dialled from memory, as often as the process needs
        tls.server_credentials(tmp_path, tls.LABEL_PARTY)
        tls.channel_credentials(tmp_path, tls.LABEL_PARTY)
    tls.generate(tmp_path, tls.identities(1), run_scoped=True)  # a resume makes new ones
    assert tls._read(tmp_path, tls.LABEL_PARTY)[2] != b"" and not (tmp_path / "label-party.key").exists()


def test_identities_made_by_certs_stay_on_disk(tmp_path: Path) -> None:
    """`splitleak certs` identities outlive a run (a host's party restarts with --resume)."""
    tls.generate(tmp_path, tls.identities(1))
    tls.claim(tmp_path, tls.LABEL_PARTY)
    assert (tmp_path / "label-party.key").exists()


def test_a_ray_role_never_writes_its_key(tmp_path: Path) -> None:
    from orchestration.sweep.roles import LABEL_PARTY, RoleHost

    certs = tmp_path / "certs"
    tls.generate(certs, tls.identities(1))
    name = tls.LABEL_PARTY
    identity = {f: (certs / f).read_bytes() for f in ("ca.pem", f"{name}.pem", f"{name}.key")}
    cfg = parse_config(small_config(tmp_path, topology={"tls": True}))
    host = RoleHost(LABEL_PARTY, cfg.to_toml(), "run", str(tmp_path / "run"), identity)
    try:
        assert host.tls_dir is not None and not list(host.tls_dir.glob("*.key"))
        assert tls._read(host.tls_dir, name)[2] == identity[f"{name}.key"]
        tls.server_credentials(host.tls_dir, name)
    finally:
        host.cleanup()


def test_rays_token_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray", reason="the Ray engine needs the optional extra splitleak[ray]")
    from orchestration.sweep.ray_engine import private_auth_token

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    old = os.umask(0o022)
    try:
        private_auth_token()
    finally:
        os.umask(old)
    token = tmp_path / ".ray" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) == 64
    token.chmod(0o644)  # left readable by an earlier cluster
    private_auth_token()
    assert stat.S_IMODE(token.stat().st_mode) == 0o600


@pytest.mark.parametrize(("tls_on", "where", "needle"), [
    (True, "missing", "does not exist"),
    (True, "no ca.pem", "ca.pem"),
    (False, "missing", "does not exist but the config says topology.tls = false"),
    (False, "no ca.pem", "holds files but the config says topology.tls = false"),
])
def test_an_unusable_tls_dir_is_refused_never_plaintext(
        tmp_path: Path, capsys: pytest.CaptureFixture, tls_on: bool, where: str, needle: str) -> None:
    config = write_config(tmp_path, small_config(tmp_path, topology={"tls": tls_on}))
    certs = tmp_path / "certs"
    if where == "no ca.pem":
        tls.generate(certs, tls.identities(2))
        (certs / "ca.pem").unlink()
    for main, argv in [
        (label_party_main, ["serve", "--config", str(config), "--run-dir", str(tmp_path / "run")]),
        (passive_party_main, ["run", "--config", str(config), "--party-id", "1", "--label-party",
                              "127.0.0.1:1", "--run-dir", str(tmp_path / "run")]),
        (attacker_main, ["serve", "--config", str(config), "--out", str(tmp_path / "run"),
                         "--listen", "127.0.0.1:0"]),
    ]:
        code, text = exit_code_and_text(main, [*argv, "--tls-dir", str(certs)], capsys)
        assert code == 2 and "Traceback" not in text, text
        assert needle in " ".join(text.split()), text
    assert not (tmp_path / "run" / "label_party" / "labels.parquet").exists()  # refused first


def test_an_empty_tls_dir_is_fine_for_plaintext(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A compose volume emptied by `prepare` for a plaintext run."""
    from splitleak.cli_common import tls_dir_or_exit

    (tmp_path / "tls").mkdir()
    cfg = parse_config(small_config(tmp_path, topology={"tls": False}))
    assert tls_dir_or_exit(cfg, tmp_path / "tls", tls.LABEL_PARTY) is None


@pytest.mark.slow
def test_an_orchestrator_killed_with_sigkill_leaves_no_key_and_blames_no_party(tmp_path: Path) -> None:
    """Its children get SIGTERM (their death signal) all at once: the label party reports the
    run interrupted, not a passive party that ended meanwhile; each process had already
    deleted its own key."""
    config = write_config(tmp_path, small_config(
        tmp_path, training={"batch_size": 8, "epochs": 1, "eval_interval": 15, "checkpoint_every": 5},
        topology={"tls": True, "step_deadline_s": scaled(20), "join_deadline_s": scaled(60)}))
    proc = cli("run", str(config), "--no-progress", start_new_session=True)
    run = run_dir(tmp_path / "runs")
    wait_for_step(run, 8, proc)
    children = pids(run)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=scaled(30))
    end = time.monotonic() + scaled(60)
    while any(alive(pid) for pid in children.values()):
        assert time.monotonic() < end, {name: alive(pid) for name, pid in children.items()}
        time.sleep(0.1)
    assert not list((run.root / "tls").glob("*.key")), list((run.root / "tls").iterdir())
    assert run.outcome.exists(), (run.logs / "label_party.log").read_text()[-3000:]
    outcome = json.loads(run.outcome.read_text())
    assert outcome["status"] == "interrupted", outcome
    assert "passive party" not in outcome.get("culprit", ""), outcome
