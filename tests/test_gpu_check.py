"""scripts/gpu_check.py and .sh, the GPU check run on a bare GPU machine: what can go wrong
there without a GPU (a dependency docs/gpu.md does not bring, the plug-in entry points of an
uninstalled checkout, a traceback instead of one line, a timeout that leaves nothing)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
assert SPEC is not None and SPEC.loader is not None
gpu_check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_check)
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DOC = (ROOT / "docs" / "gpu.md").read_text()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_doc_brings_every_dependency_the_machine_lacks() -> None:
    """Every pyproject dependency is on docs/gpu.md's list of what the machine has, or among
    the wheels its download loop fetches (setproctitle was neither)."""
    has = re.search(r"its own CUDA torch \(2\.11\)\. It also has (.*?)\. It has grpcio", DOC,
                    re.S)
    loop = re.search(r"for p in (.*?); do", DOC, re.S)
    assert has and loop, "docs/gpu.md lost its machine list or its download loop"
    there = {"torch"} | {_norm(n) for n in re.split(r",\s*|\s+and\s+", has.group(1).strip())}
    wheels = {_norm(re.split(r"[=<>]", w)[0]) for w in loop.group(1).replace("\\", " ").split()}
    lacking = [name for name in (_norm(gpu_check._requirement(d)[0])
                                 for d in PROJECT["dependencies"])
               if name not in there | wheels]
    assert not lacking, f"docs/gpu.md neither lists nor downloads {lacking}"


def test_missing_and_too_old_dependencies_are_named() -> None:
    missing = gpu_check.missing_dependencies([
        "numpy>=1", "surely-not-a-package-xyz>=1", "numpy>=9999",
        "also-not-there; sys_platform == 'nonesuch'"])
    assert missing[0] == "surely-not-a-package-xyz (not installed)"
    assert missing[1].startswith("numpy (") and missing[1].endswith(">=9999 wanted)")
    assert len(missing) == 2


def test_the_entry_points_are_registered_for_an_uninstalled_checkout(tmp_path: Path) -> None:
    gpu_check.register_entry_points(tmp_path, PROJECT)
    (dist,) = md.distributions(path=[str(tmp_path)])
    groups = {ep.name: ep.value for ep in dist.entry_points if ep.group == "splitleak.plugins"}
    assert groups == PROJECT["entry-points"]["splitleak.plugins"]
    assert {ep.name for ep in dist.entry_points if ep.group == "console_scripts"} \
        == set(PROJECT["scripts"])


def test_prepare_passes_where_everything_is_installed(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", str(tmp_path / "out"),
                           "--prepare", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_failing_section_is_one_line_and_the_next_still_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    check = gpu_check.Check(tmp_path, 100, tmp_path)
    check.section("broken", lambda: 1 / 0, 1)
    check.section("fine", lambda: {"x": 1}, 1)
    check.section("too long", lambda: {"x": 2}, 1000)
    printed = capsys.readouterr().out
    assert "Traceback" not in printed and "broken: ZeroDivisionError: division by zero" in printed
    assert "Traceback" in check.log.read_text()
    found = json.loads((tmp_path / "gpu_check.json").read_text())
    assert found["broken"]["ok"] is False and found["fine"]["ok"] is True
    assert found["too long"]["ok"] is None and "budget" in found["too long"]["skipped"]


def test_a_command_past_its_limit_is_killed_with_its_children(tmp_path: Path) -> None:
    check = gpu_check.Check(tmp_path, 100, tmp_path)
    marker = tmp_path / "late"
    began = time.perf_counter()
    found = check.command(["sh", "-c", f"(sleep 3; touch {marker}) & echo started; sleep 30"],
                          1)
    assert time.perf_counter() - began < 10 and str(found["returncode"]).startswith("killed")
    assert found["tail"] == ["$ " + f"sh -c (sleep 3; touch {marker}) & echo started; sleep 30",
                             "started"]
    time.sleep(3.5)
    assert not marker.exists(), "the command's child outlived the kill"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine with no GPU")
def test_a_gpu_part_without_a_gpu_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", str(tmp_path), "--part",
                           "graphs"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("gpu_check: part graphs needs a CUDA device")
    assert len(done.stderr.splitlines()) == 1


def test_the_shell_refuses_an_unknown_part_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(["bash", "scripts/gpu_check.sh", str(tmp_path), "gpus"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (
        2, "gpu_check.sh: part 'gpus' is none of gpu, graphs, cpu, all\n")
