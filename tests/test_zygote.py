"""The zygote: roles forked from one pre-imported process behave as `python -m` processes do
(arguments, output, exit status, environment, directory, session), children may ask it too,
and nothing it started outlives the one that asked."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from orchestration import zygote_client
from orchestration.processes import spawn, stop_all
from tests.conftest import scaled
from tests.plugin_package import install
from tests.runs import alive


@pytest.fixture(scope="module")
def zygote():
    started = zygote_client.Zygote.start()
    yield started
    started.close()


def _run(zygote, args: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    child = zygote.spawn(args[0], args[1:], log, {**os.environ, **(env or {})})
    code = child.wait(scaled(60))
    return code, log.read_text()


def test_a_forked_child_runs_the_module_with_its_arguments_directory_and_environment(
        zygote, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, log = _run(zygote, ["tests.zygote_probe", "report", "x y"], tmp_path / "child.log",
                     {"ZYGOTE_PROBE": "seen"})
    assert code == 0
    assert f"cwd={tmp_path} probe=seen leader=True argv=['report', 'x y']" in log


def test_a_forked_child_finds_the_plugins_on_its_own_python_path(zygote, tmp_path: Path) -> None:
    """The zygote started before the package was put on the path (a session's zygote, a run
    started from a notebook that set PYTHONPATH after its first run): a child forked for a
    requester whose PYTHONPATH holds the package finds its plug-ins, as `python -m` would. They
    were missing: the child kept the zygote's sys.path."""
    env = install(tmp_path / "site", "zygote_probe_plugins",
                  "from splitleak.datasets.wine import Wine\n\nclass Other(Wine):\n    pass\n",
                  {"splitleak.datasets": {"zygote_probe_set": "zygote_probe_plugins:Other"}})
    code, log = _run(zygote, ["tests.zygote_probe", "plugins"], tmp_path / "child.log", env)
    assert code == 0, log
    assert "zygote_probe_set" in log.split("datasets=")[1].split()[0].split(","), log


def test_a_forked_child_collects_none_of_the_heap_it_inherited(zygote, tmp_path: Path) -> None:
    """A full collection falling due in a child's start-up walked the whole inherited heap
    (torch, gRPC, the plug-ins), copying each page it touched: the label party served 0.3-0.6 s
    later on 2 cores. The zygote now freezes what it imported before each fork."""
    code, log = _run(zygote, ["tests.zygote_probe", "gc"], tmp_path / "child.log")
    assert code == 0, log
    assert int(log.split("frozen=")[1].split()[0]) > 100_000, log  # torch alone is more


def test_ps_shows_a_forked_child_as_its_own_command(zygote, tmp_path: Path) -> None:
    child = zygote.spawn("tests.zygote_probe", ["sleep", "30"], tmp_path / "child.log",
                         dict(os.environ))
    try:
        end = time.monotonic() + scaled(30)
        while "zygote_probe" not in (line := Path(f"/proc/{child.pid}/cmdline").read_text()):
            assert time.monotonic() < end, line
            time.sleep(0.05)
        assert line.startswith(f"{sys.executable} -m tests.zygote_probe sleep 30")
    finally:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(scaled(30))


@pytest.mark.parametrize(("args", "code", "said"), [
    (["exit", "2"], 2, ""),
    (["message", "bad input here"], 1, "bad input here"),
    (["unknown"], 1, "ValueError: unknown mode 'unknown'"),  # a traceback, as python -m prints
])
def test_exit_status_and_output_are_those_of_python_dash_m(zygote, tmp_path: Path, args, code,
                                                            said) -> None:
    got, log = _run(zygote, ["tests.zygote_probe", *args], tmp_path / "child.log")
    assert got == code and said in log


def test_a_child_killed_by_a_signal_reports_it_as_popen_does(zygote, tmp_path: Path) -> None:
    child = zygote.spawn("tests.zygote_probe", ["sleep", "60"], tmp_path / "child.log", dict(os.environ))
    os.killpg(child.pid, signal.SIGKILL)  # its own session: the group is the child's
    assert child.wait(scaled(30)) == -signal.SIGKILL


def test_a_forked_child_can_start_its_own_children_through_the_same_zygote(tmp_path: Path) -> None:
    child = spawn("nested", ["tests.zygote_probe", "nested", str(tmp_path / "grandchild.log")],
                  tmp_path / "nested.log")
    assert isinstance(child.process, zygote_client.ZygoteChild)  # forked, not started anew
    assert child.process.wait(scaled(60)) == 0, child.log_tail()
    assert "code=3" in child.log_tail()


def test_the_children_of_a_client_that_goes_away_are_stopped(tmp_path: Path) -> None:
    own = zygote_client.Zygote.start()
    try:
        own.ready()
        client = zygote_client.Zygote(own.path)  # a second client of the same zygote
        child = client.spawn("tests.zygote_probe", ["sleep", "120"], tmp_path / "child.log",
                             dict(os.environ))
        assert alive(child.pid)
        client.close()  # the client disconnects without stopping its child
        end = time.monotonic() + scaled(30)
        while alive(child.pid) and time.monotonic() < end:
            time.sleep(0.05)
        assert not alive(child.pid)
    finally:
        own.close()


def test_spawn_starts_python_anew_when_no_zygote_answers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(zygote_client, "_current", zygote_client.Zygote(str(tmp_path / "none")))
    child = spawn("probe", ["tests.zygote_probe", "exit", "4"], tmp_path / "probe.log")
    try:
        assert not isinstance(child.process, zygote_client.ZygoteChild)
        assert child.process.wait(scaled(60)) == 4
    finally:
        stop_all([child])
