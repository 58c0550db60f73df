"""The GPU check: everything a GPU machine must show, in one go, with its figures.

    python3 scripts/gpu_check.py OUT_DIR [--part gpu|graphs|cpu|all] [--anchor PATH] [--quick]
                                 [--budget-s S]

`scripts/gpu_check.sh` runs it on a bare GPU machine (the machine's own torch, the project's
other dependencies from carried wheels; `--prepare SITE` is its first step: the plug-in entry
points registered in SITE, every dependency checked). Part `gpu`: the `gpu` tests; the plain
single-process loop of Fu et al.'s CIFAR-10 split (`--anchor`, when given) in the same call;
one epoch of that split on 50,000 random-pixel CIFAR records, distributed and in-process; a
deterministic distributed run; model completion on the GPU; `splitleak bench --device cuda`.
Part `graphs`: run.cuda_graphs (each party's train step replayed as CUDA graphs) in one call
with the plain loop: its `gpu` tests, one epoch distributed and in-process, `splitleak bench
--cuda-graphs` (eager and graphed variants side by side). Part `cpu`: `splitleak bench` on the
machine's cores at N = 8. `all` is the three in that order; it does not fit one 600 s call
(docs/gpu.md). Every section has its own time limit and an estimate of its time: a section that
would not end inside `--budget-s` (from the start) is skipped, saying so. What a section found
is written to OUT_DIR/gpu_check.json as it ends, every command's output to OUT_DIR/gpu_check.log
(two files: the device tool brings back at most eight), and a failed section does not stop the
next. `--quick` shrinks every size, runs a few of the `gpu` tests and benches only the 1-thread
baseline (a dry run of the script in minutes); where torch sees no CUDA device, the `gpu` and
`graphs` parts then run their steps on the CPU instead (the plain loop and the graphed bench,
which need CUDA, are skipped), and without `--quick` they are refused."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GPU_EXAMPLE = ROOT / "examples" / "gpu" / "cifar10-resnet18.toml"  # Fu et al.'s split, batch 32
PAPER_NONE = ROOT / "examples" / "threat" / "cifar10" / "paper" / "cifar10-none.toml"
sys.path.insert(0, str(ROOT))

RECORD = 1 + 3 * 32 * 32  # CIFAR-10's binary layout: the label byte, then the pixels
# Modules the check and every role import: a dependency that is there but broken (a wheel for
# another Python, protobuf older than the generated stubs) fails here, before any section.
ROLE_MODULES = ("numpy", "tomli_w", "orchestration.run", "orchestration.reference",
                "orchestration.zygote", "label_party.cli", "passive_party.cli", "attacker.cli",
                "attacker.analysis.analyze")


class Refused(Exception):
    """The check cannot start; the message says why in one sentence."""


def _requirement(spec: str) -> tuple[str, str, str]:
    """'name>=1.0; marker' -> (name, version specifier, marker)."""
    spec, _, marker = spec.partition(";")
    match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[[^\]]*\])?\s*(.*)", spec)
    assert match is not None, spec
    return match.group(1), match.group(2).strip(), marker.strip()


def missing_dependencies(dependencies: list[str]) -> list[str]:
    """The project's dependencies (pyproject.toml) that are not installed, or not at a version
    it accepts, each as 'name (why)'."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        from packaging.markers import Marker
        from packaging.specifiers import SpecifierSet
    except ImportError:  # without packaging: presence alone, markers taken as true
        Marker = SpecifierSet = None  # type: ignore[assignment,misc]  # noqa: N806
    missing = []
    for spec in dependencies:
        name, wanted, marker = _requirement(spec)
        if marker and Marker is not None and not Marker(marker).evaluate():
            continue
        try:
            have = version(name)
        except PackageNotFoundError:
            missing.append(f"{name} (not installed)")
            continue
        if wanted and SpecifierSet is not None and not SpecifierSet(wanted).contains(
                have, prereleases=True):
            missing.append(f"{name} ({have} installed, {wanted} wanted)")
    return missing


def register_entry_points(site: Path, project: dict[str, Any]) -> Path:
    """A dist-info in `site` that declares the project's entry points (the plug-in groups the
    roles find through importlib.metadata), as an install of the checkout would."""
    folder = site / f"{project['name']}-{project['version']}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    (folder / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in entries.items()) + "\n"
        for group, entries in groups.items()))
    return folder


def prepare(site: Path) -> None:
    """The first step on a bare machine: entry points registered in `site` (on PYTHONPATH),
    every dependency installed and every role's modules importable; else Refused."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    register_entry_points(site, project)
    missing = missing_dependencies(project["dependencies"])
    if missing:
        raise Refused(f"the project's dependencies are missing here: {', '.join(missing)}; "
                      "bring each as a wheel in .whl/ (docs/gpu.md, 'Prepare the "
                      "checkout here')")
    import importlib

    for module in ROLE_MODULES:
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - one line naming what is wrong
            raise Refused(f"importing {module} failed: {type(err).__name__}: {err}") from None
    from splitleak.plugins import plugin_groups

    try:
        plugin_groups()
    except Exception as err:  # noqa: BLE001
        raise Refused(f"the plug-in groups do not load: {type(err).__name__}: {err}") from None


def write_random_cifar(folder: Path, per_batch: int) -> Path:
    """Five train batches and a test batch of random-pixel records, in CIFAR-10's layout."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in (*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin"):
        records = rng.integers(0, 256, (per_batch, RECORD), dtype=np.uint8)
        records[:, 0] = rng.integers(0, 10, per_batch)
        (folder / name).write_bytes(records.tobytes())
    return folder


def config_file(source: Path, out: Path, **sections: dict[str, Any]) -> Path:
    """`source` with some fields replaced (section -> {field: value})."""
    import tomli_w

    data = tomllib.loads(source.read_text())
    for section, values in sections.items():
        node = data
        for part in section.split("."):
            node = node.setdefault(part, {})
        node.update(values)
    out.write_text(tomli_w.dumps(data))
    return out


class Check:
    """Runs sections in order, each under a time limit and inside the whole check's budget,
    keeping what each found in OUT/gpu_check.json and their output in OUT/gpu_check.log."""

    def __init__(self, out: Path, budget_s: float, work: Path) -> None:
        self.out, self.budget_s, self.work = out, budget_s, work
        self.began = time.perf_counter()
        self.found: dict[str, Any] = {}
        self.log = out / "gpu_check.log"
        self.log.write_text("")

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.began)

    def note(self, text: str) -> None:
        with self.log.open("a") as handle:
            handle.write(text if text.endswith("\n") else text + "\n")

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.found, indent=1, default=str))

    def skip(self, name: str, why: str) -> None:
        print(f"\n=== {name}\n--- {name}: skipped: {why}", flush=True)
        self.found[name] = {"ok": None, "skipped": why, "seconds": 0.0}
        self.save()

    def section(self, name: str, work: Callable[[], Any], need_s: float) -> None:
        """Run `work` unless its estimate `need_s` outruns what is left of the budget."""
        if need_s > self.left():
            self.skip(name, f"needs about {need_s:.0f} s, {max(self.left(), 0):.0f} s of "
                            "--budget-s left")
            return
        print(f"\n=== {name}", flush=True)
        self.note(f"\n=== {name}")
        began = time.perf_counter()
        try:
            found = work()
            failed = isinstance(found, dict) and found.get("returncode") not in (None, 0)
            result = {"ok": not failed, "result": found}
        except Exception as err:  # noqa: BLE001 - the next section still runs
            self.note(traceback.format_exc())
            result = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            print(f"{name}: {result['error']} (traceback in {self.log})", flush=True)
        result["seconds"] = round(time.perf_counter() - began, 1)
        self.found[name] = result
        self.save()
        print(f"--- {name}: {'ok' if result['ok'] else 'FAILED'} in {result['seconds']} s",
              flush=True)

    def command(self, args: list[str], timeout: float, env: dict[str, str] | None = None,
                json_out: Path | None = None) -> dict[str, Any]:
        """Run `args` in its own process group (killed whole at the time limit, or when the
        budget runs out), its output appended to the log; with `json_out`, what it wrote there."""
        timeout = max(min(timeout, self.left()), 1.0)
        began = time.perf_counter()
        first = self.log.stat().st_size
        with self.log.open("a") as handle:
            handle.write("$ " + " ".join(args) + "\n")
            handle.flush()
            process = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                                       start_new_session=True,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
            try:
                code: int | str = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                code = f"killed after {timeout:.0f} s"
        with self.log.open() as handle:
            handle.seek(first)
            tail = handle.read().splitlines()[-15:]
        print("\n".join(tail), flush=True)
        found: dict[str, Any] = {"returncode": code, "seconds": time.perf_counter() - began,
                                 "tail": tail}
        if json_out is not None and json_out.exists():
            found["json"] = json.loads(json_out.read_text())
        return found


def trained(cfg_path: Path, distributed: bool) -> dict[str, Any]:
    """Train one config (no analysis); steps/s past the first 50 steps, the whole wall time."""
    from orchestration.reference import run_reference
    from orchestration.run import run_distributed
    from splitleak.artifacts.metrics import read_metrics
    from splitleak.artifacts.rundir import create_run_dir
    from splitleak.artifacts.summary import read_training_summary
    from splitleak.artifacts.timing import read_timing_file
    from splitleak.config import load_config

    cfg = load_config(cfg_path)
    run = create_run_dir(cfg)
    began = time.perf_counter()
    (run_distributed if distributed else run_reference)(cfg, run)
    wall = time.perf_counter() - began
    records = list(read_metrics(run.metrics))
    walls = [r["wall"] for r in records if r["type"] == "train"]
    warm = min(50, len(walls) // 4)
    evals = [r for r in records if r["type"] == "eval"]
    summary = read_training_summary(run).as_dict() if run.summary.exists() else {}
    return {"run": str(run.root), "train_steps": len(walls), "wall_s": wall,
            "training_s": walls[-1] if walls else None,
            "steady_steps_per_s": (len(walls) - 1 - warm) / (walls[-1] - walls[warm])
            if len(walls) > warm + 1 else None,
            "first_step_s": summary.get("time_to_first_step_s"),
            "devices": summary.get("devices"), "final_eval": evals[-1] if evals else None,
            "timing": {role: read_timing_file(p) for role, p in (
                ("label", run.label_timing), ("party1", run.passive_timing(1))) if p.exists()}}


class Plan:
    """What the run is: sizes (`quick`), where the `gpu` and `graphs` parts compute (`device`:
    cuda, or cpu for a dry run where torch sees none) and the plain loop's script."""

    def __init__(self, check: Check, quick: bool, device: str, anchor: Path | None) -> None:
        self.check, self.quick, self.device, self.anchor = check, quick, device, anchor
        self.data: Path | None = None
        self.configs = check.work / "configs"
        self.configs.mkdir(parents=True, exist_ok=True)

    def need(self, full_s: float, quick_s: float) -> float:
        """A section's estimated seconds (full: measured on one H200, docs/gpu.md)."""
        return quick_s if self.quick else full_s

    def config(self, source: Path, name: str, steps: int | None = None, **run: Any) -> Path:
        """`source` on random CIFAR records for one epoch, or `steps` train steps (20 when
        quick)."""
        if self.data is None:
            self.data = write_random_cifar(self.check.work / "cifar-10-batches-bin",
                                           200 if self.quick else 10_000)
        limit = 20 if self.quick else steps
        return config_file(source, self.configs / f"{name}.toml",
                           dataset={"params": {"path": str(self.data)}},
                           training={"epochs": 1, **({"max_steps": limit} if limit else {})},
                           run={"output_dir": str(self.check.work / "runs"),
                                "device": self.device, **run})

    def environment(self) -> None:
        import torch

        self.check.section("environment", lambda: {
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "cores": len(os.sched_getaffinity(0)), "python": sys.version.split()[0],
            "quick": self.quick, "budget_s": self.check.budget_s}, 10)

    def gpu_tests(self, select: str | None, need_s: float) -> None:
        """The `gpu` tests (`select`: pytest's -k); when quick, one distributed run of each
        kind only (the whole file takes minutes on a CPU)."""
        env = {"SPLITLEAK_GPU_TEST_DEVICE": "cpu"} if self.device == "cpu" else {}
        if self.quick:
            select = "cuda_graphs_run or zygote" if select is None else "cuda_graphs_run"
        self.check.section("gpu tests" + (f" ({select})" if select else ""),
                           lambda: self.check.command(
            [sys.executable, "-m", "pytest", "tests/test_gpu.py", "-q", "-p", "no:cacheprovider",
             "-o", "addopts=-ra", *(["-k", select] if select else [])], 300, env), need_s)

    def plain_loop(self) -> None:
        if self.anchor is None:
            return
        if not self.anchor.exists():
            self.check.skip("plain single-process loop (anchor)", f"{self.anchor} is not there")
            return
        if self.device != "cuda":
            self.check.skip("plain single-process loop (anchor)", "it needs a CUDA device")
            return
        result = self.check.out / "anchor.json"
        self.check.section("plain single-process loop (anchor)", lambda: self.check.command(
            [sys.executable, str(self.anchor), str(result)], 180, json_out=result), 40)

    def bench(self, name: str, need_s: float, *extra: str) -> None:
        if "--cuda-graphs" in extra and self.device != "cuda":
            self.check.skip(name, "--cuda-graphs needs a CUDA device")
            return
        result = self.check.out / f"{name.replace(' ', '_')}.json"
        self.check.section(name, lambda: self.check.command(
            [sys.executable, "-m", "orchestration", "bench", "--device", self.device, "--setup",
             "cifar-resnet18", "--rounds", "1" if self.quick else "2", "--steps",
             "10" if self.quick else "150", *(["--threads", "1"] if self.quick else []), *extra,
             "--json", str(result)], 500,
            json_out=result), need_s)


def gpu_part(plan: Plan) -> None:
    check = plan.check
    plan.environment()
    plan.gpu_tests(None, plan.need(120, 150))
    plan.plain_loop()
    fast = plan.config(GPU_EXAMPLE, "epoch")
    check.section("one epoch, distributed", lambda: trained(fast, True), plan.need(60, 40))
    check.section("one epoch, in-process", lambda: trained(fast, False), plan.need(55, 30))
    exact = plan.config(GPU_EXAMPLE, "deterministic", 400, deterministic=True)
    check.section("400 steps, distributed, deterministic", lambda: trained(exact, True),
                  plan.need(30, 40))
    paper = plan.config(PAPER_NONE, "paper", 300, deterministic=False)

    def completion() -> dict[str, Any]:
        from attacker.analysis.analyze import analyze

        run = trained(paper, True)
        steps = 20 if plan.quick else 2000
        began = time.perf_counter()
        summary = analyze(Path(run["run"]), [("model_completion", {"baselines": False,
                                                                    "steps": steps})],
                          device=plan.device)
        entry = next(e for e in summary["leak"] if e["attack"].startswith("model_completion"))
        return {"analysis_s": time.perf_counter() - began, "steps": steps,
                "completion": entry.get("completion"), "training": run}

    check.section("model completion on the GPU", completion, plan.need(85, 60))
    plan.bench("bench gpu", plan.need(125, 90))


def graphs_part(plan: Plan, with_anchor: bool) -> None:
    """run.cuda_graphs against eager and the plain loop, in one call: its `gpu` tests, one
    epoch with graphs distributed and in-process, the bench with its graph variants."""
    check = plan.check
    plan.environment()
    plan.gpu_tests("cuda_graphs", plan.need(40, 60))
    if with_anchor:
        plan.plain_loop()
    graphed = plan.config(GPU_EXAMPLE, "epoch-graphs", cuda_graphs=True)
    check.section("one epoch, distributed, CUDA graphs", lambda: trained(graphed, True),
                  plan.need(60, 40))
    check.section("one epoch, in-process, CUDA graphs", lambda: trained(graphed, False),
                  plan.need(55, 30))
    plan.bench("bench gpu graphs", plan.need(210, 90), "--cuda-graphs")


def cpu_part(plan: Plan) -> None:
    result = plan.check.out / "bench_cpu.json"
    plan.check.section("bench on the CPU cores", lambda: plan.check.command(
        [sys.executable, "-m", "orchestration", "bench", "--device", "cpu", "--rounds",
         "1" if plan.quick else "2", "--steps", "10" if plan.quick else "100", "--parties",
         "2" if plan.quick else "8", *(["--threads", "1"] if plan.quick else []), "--json",
         str(result)], 420, json_out=result),
        plan.need(240, 90))


def where(part: str, quick: bool) -> str:
    """Where the `gpu` and `graphs` parts compute: cuda, or cpu for a quick dry run where torch
    sees no CUDA device; Refused where a full run of them has no CUDA device."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if part != "cpu" and not quick:
        raise Refused(f"part {part} needs a CUDA device and torch {torch.__version__} sees none; "
                      "run part cpu, or add --quick for a dry run on the CPU")
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--part", choices=("gpu", "graphs", "cpu", "all"), default="all")
    parser.add_argument("--anchor", type=Path, help="the plain single-process loop's script")
    parser.add_argument("--quick", action="store_true",
                        help="every size shrunk: a dry run (on the CPU where there is no GPU)")
    parser.add_argument("--budget-s", type=float, default=560.0,
                        help="skip any section that would end later than this many seconds "
                             "from the start (default 560: one device call is 600 s at most)")
    parser.add_argument("--prepare", type=Path, metavar="SITE",
                        help="only register the entry points in SITE and check the "
                             "dependencies (scripts/gpu_check.sh's first step)")
    args = parser.parse_args(argv)
    try:
        if args.prepare is not None:
            prepare(args.prepare)
            return 0
        device = where(args.part, args.quick)
        args.out.mkdir(parents=True, exist_ok=True)
    except (Refused, OSError) as err:
        print(f"gpu_check: {err}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="splitleak-gpu-check-") as scratch:
        check = Check(args.out, args.budget_s, Path(scratch))
        plan = Plan(check, args.quick, device, args.anchor)
        if args.part in ("gpu", "all"):
            gpu_part(plan)
        if args.part in ("graphs", "all"):
            graphs_part(plan, with_anchor=args.part == "graphs")
        if args.part in ("cpu", "all"):
            cpu_part(plan)
    print("\n=== summary")
    for name, result in check.found.items():
        state = {True: "ok    ", False: "FAILED", None: "skip  "}[result["ok"]]
        print(f"{state} {result['seconds']:7.1f} s  {name}")
    return 0 if all(r["ok"] is not False for r in check.found.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
