"""A process the orchestrator spawned ends when the orchestrator does, with no Python code
run between fork and exec: the child arms its own death signal (splitleak.lifeline)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from splitleak.lifeline import PARENT_ENV
from tests.conftest import scaled, small_config, write_config
from tests.runs import alive

PARENT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from orchestration.processes import spawn
    out, config, wait = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "wait"
    child = spawn("attacker sidecar", ["attacker", "serve", "--listen", "127.0.0.1:0", "--out",
                  str(out), "--config", config, "--run-id", "r", "--port-file", str(out / "address")],
                  out / "attacker.log")
    print(child.process.pid, flush=True)
    end = time.monotonic() + float(sys.argv[4])
    while wait and not (out / "address").exists() and time.monotonic() < end:
        time.sleep(0.05)
    os._exit(0)  # the orchestrator dies without stopping its child
""")


def _orphaned_sidecar(tmp_path: Path, wait_until_serving: bool) -> tuple[int, Path]:
    out = tmp_path / "sidecar"
    out.mkdir()
    config = write_config(tmp_path, small_config(tmp_path))
    parent = subprocess.run([sys.executable, "-c", PARENT, str(out), str(config),
                             "wait" if wait_until_serving else "now", str(scaled(120))],
                            capture_output=True, text=True, timeout=scaled(180), check=True)
    return int(parent.stdout.split()[0]), out


def _ends(pid: int, within: float) -> bool:
    end = time.monotonic() + within
    while alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not alive(pid)


def test_a_serving_child_is_stopped_by_sigterm_when_its_parent_dies(tmp_path: Path) -> None:
    pid, out = _orphaned_sidecar(tmp_path, wait_until_serving=True)
    assert (out / "address").exists(), (out / "attacker.log").read_text()
    assert _ends(pid, scaled(60)), "the sidecar outlived the process that started it"
    log = (out / "attacker.log").read_text()
    assert "interrupted by a signal" in log, log  # SIGTERM: its own clean shutdown, not a kill


def test_a_child_whose_parent_died_while_it_started_exits_at_once(tmp_path: Path) -> None:
    pid, out = _orphaned_sidecar(tmp_path, wait_until_serving=False)
    assert _ends(pid, scaled(60)), "the sidecar outlived the process that started it"


def test_a_child_of_a_parent_already_gone_exits_naming_it(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    env = {**os.environ, PARENT_ENV: str(gone.pid)}
    ran = subprocess.run([sys.executable, "-m", "attacker", "--help"], env=env, capture_output=True,
                         text=True, timeout=scaled(60))
    assert ran.returncode == 1
    assert f"the process that started this one (pid {gone.pid}) has already ended" in ran.stderr
    assert "Traceback" not in ran.stderr and "usage" not in ran.stdout


def test_a_parent_that_is_not_a_pid_is_refused_naming_the_variable(tmp_path: Path) -> None:
    ran = subprocess.run([sys.executable, "-m", "attacker", "--help"], env={**os.environ, PARENT_ENV: "x1"},
                         capture_output=True, text=True, timeout=scaled(60))
    assert ran.returncode == 1 and "Traceback" not in ran.stderr
    assert f"{PARENT_ENV} must be the pid of the process that started this one, not 'x1'" in ran.stderr


def test_the_parent_is_not_passed_on_to_grandchildren(tmp_path: Path) -> None:
    probe = ("import os; from splitleak.lifeline import follow_parent, PARENT_ENV; follow_parent(); "
             "print(os.environ.get(PARENT_ENV))")
    ran = subprocess.run([sys.executable, "-c", probe], env={**os.environ, PARENT_ENV: str(os.getpid())},
                         capture_output=True, text=True, timeout=scaled(60), check=True)
    assert ran.stdout.strip() == "None"


def test_spawn_runs_no_python_between_fork_and_exec(tmp_path: Path, monkeypatch) -> None:
    from orchestration import processes

    started: list[dict] = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        started.append(kwargs)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(processes.subprocess, "Popen", recording_popen)
    monkeypatch.setenv("SPLITLEAK_ZYGOTE", "off")  # a new process, not a fork of the zygote
    child = processes.spawn("probe", ["attacker", "--help"], tmp_path / "probe.log")
    try:
        child.process.wait(timeout=scaled(60))
    finally:
        processes.stop_all([child])
    (kwargs,) = started
    assert kwargs.get("preexec_fn") is None and kwargs["start_new_session"]
    assert kwargs["env"][PARENT_ENV] == str(os.getpid())
    assert child.process.returncode == 0 and "usage" in child.log_tail()
