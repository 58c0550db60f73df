"""The GPU check: everything a GPU machine must show, in one go, with its figures.

    python3 scripts/gpu_check.py OUT_DIR [--part gpu|graphs|cpu|all] [--anchor PATH] [--quick]

`scripts/gpu_check.sh` runs it on a bare GPU machine (the machine's own torch, the project's
other dependencies from carried wheels). Part `gpu`: the `gpu` tests; the plain single-process
loop of Fu et al.'s CIFAR-10 split (`--anchor`, when given) in the same call; one epoch of
that split on 50,000 random-pixel CIFAR records, distributed and in-process; a deterministic
distributed run; model completion on the GPU; `splitleak bench --device cuda`. Part `graphs`:
run.cuda_graphs (each party's train step replayed as CUDA graphs) in one call with the plain
loop: its `gpu` tests, one epoch distributed and in-process, `splitleak bench --cuda-graphs`
(eager and graphed variants side by side). Part `cpu`:
`splitleak bench` on the machine's cores at N = 2 and 8. Every section has its own time
limit; what a section found is written to OUT_DIR/gpu_check.json as it ends, and a failed
section does not stop the next. `--quick` shrinks every size (a dry run of the script)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

ROOT = Path(__file__).resolve().parent.parent
GPU_EXAMPLE = ROOT / "examples" / "gpu" / "cifar10-resnet18.toml"  # Fu et al.'s split, batch 32
sys.path.insert(0, str(ROOT))

RECORD = 1 + 3 * 32 * 32  # CIFAR-10's binary layout: the label byte, then the pixels


def write_random_cifar(folder: Path, per_batch: int) -> Path:
    """Five train batches and a test batch of random-pixel records, in CIFAR-10's layout."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in (*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin"):
        records = rng.integers(0, 256, (per_batch, RECORD), dtype=np.uint8)
        records[:, 0] = rng.integers(0, 10, per_batch)
        (folder / name).write_bytes(records.tobytes())
    return folder


def config_file(source: Path, out: Path, **sections: dict[str, Any]) -> Path:
    """`source` with some fields replaced (section -> {field: value})."""
    data = tomllib.loads(source.read_text())
    for section, values in sections.items():
        node = data
        for part in section.split("."):
            node = node.setdefault(part, {})
        node.update(values)
    out.write_text(tomli_w.dumps(data))
    return out


class Check:
    """Runs sections in order, each under a time limit, keeping what each found."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.found: dict[str, Any] = {}

    def section(self, name: str, work: Callable[[], Any]) -> None:
        print(f"\n=== {name}", flush=True)
        began = time.perf_counter()
        try:
            found = work()
            failed = isinstance(found, dict) and found.get("returncode") not in (None, 0)
            result = {"ok": not failed, "result": found}
        except Exception as err:  # noqa: BLE001 - the next section still runs
            traceback.print_exc()
            result = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        result["seconds"] = round(time.perf_counter() - began, 1)
        self.found[name] = result
        (self.out / "gpu_check.json").write_text(json.dumps(self.found, indent=1, default=str))
        print(f"--- {name}: {'ok' if result['ok'] else 'FAILED'} in {result['seconds']} s",
              flush=True)


def run_command(args: list[str], timeout: float, log: Path) -> dict[str, Any]:
    began = time.perf_counter()
    with log.open("w") as handle:
        done = subprocess.run(args, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout,
                              cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    tail = log.read_text().splitlines()[-15:]
    print("\n".join(tail), flush=True)
    return {"returncode": done.returncode, "seconds": time.perf_counter() - began, "tail": tail}


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


def environment(check: Check) -> None:
    import torch

    check.section("environment", lambda: {
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cores": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]})


def gpu_tests(check: Check, out: Path, select: str | None = None) -> None:
    check.section("gpu tests" + (f" ({select})" if select else ""), lambda: run_command(
        [sys.executable, "-m", "pytest", "tests/test_gpu.py", "-q", "-p", "no:cacheprovider",
         "-o", "addopts=-ra", *(["-k", select] if select else [])], 300, out / "gpu_tests.log"))


def plain_loop(check: Check, out: Path, anchor: Path | None) -> None:
    if anchor is not None and anchor.exists():
        check.section("plain single-process loop (anchor)", lambda: run_command(
            [sys.executable, str(anchor), str(out / "anchor.json")], 180, out / "anchor.log")
            | {"runs": json.loads((out / "anchor.json").read_text())["runs"]})


class Setups:
    """The config files of the check, on random-pixel records in CIFAR-10's layout."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.data = write_random_cifar(Path("/tmp/splitleak-gpu-check/cifar-10-batches-bin"),
                                       1_000 if quick else 10_000)
        self.work = Path("/tmp/splitleak-gpu-check/configs")
        self.work.mkdir(parents=True, exist_ok=True)

    def config(self, source: Path, name: str, steps: int | None = None, **run: Any) -> Path:
        """`source` on these records for one epoch, or `steps` train steps (20 when quick)."""
        limit = 20 if self.quick else steps
        return config_file(source, self.work / f"{name}.toml",
                           dataset={"params": {"path": str(self.data)}},
                           training={"epochs": 1, **({"max_steps": limit} if limit else {})},
                           run={"output_dir": "/tmp/splitleak-gpu-check/runs", **run})


def bench_gpu(check: Check, out: Path, quick: bool, name: str, *extra: str) -> None:
    check.section(name, lambda: run_command(
        [sys.executable, "-m", "orchestration", "bench", "--device", "cuda", "--setup",
         "cifar-resnet18", "--rounds", "1" if quick else "2", "--steps", "30" if quick else "150",
         *extra, "--json", str(out / f"{name.replace(' ', '_')}.json")], 500,
        out / f"{name.replace(' ', '_')}.log"))


def gpu_part(check: Check, out: Path, quick: bool, anchor: Path | None) -> None:
    import torch

    environment(check)
    gpu_tests(check, out)
    plain_loop(check, out, anchor)
    setups = Setups(quick)
    fast = setups.config(GPU_EXAMPLE, "epoch")
    check.section("one epoch, distributed", lambda: trained(fast, True))
    check.section("one epoch, in-process", lambda: trained(fast, False))
    exact = setups.config(GPU_EXAMPLE, "deterministic", 400, deterministic=True)
    check.section("400 steps, distributed, deterministic", lambda: trained(exact, True))
    paper = setups.config(ROOT / "examples" / "threat" / "cifar10" / "paper" / "cifar10-none.toml",
                         "paper", 300, deterministic=False)

    def completion() -> dict[str, Any]:
        from attacker.analysis.analyze import analyze

        run = trained(paper, True)
        steps = 20 if quick else 2000
        began = time.perf_counter()
        summary = analyze(Path(run["run"]), [("model_completion", {"baselines": False,
                                                                    "steps": steps})],
                          device="cuda" if torch.cuda.is_available() else "cpu")
        entry = next(e for e in summary["leak"] if e["attack"].startswith("model_completion"))
        return {"analysis_s": time.perf_counter() - began, "steps": steps,
                "completion": entry.get("completion"), "training": run}

    check.section("model completion on the GPU", completion)
    bench_gpu(check, out, quick, "bench gpu")


def graphs_part(check: Check, out: Path, quick: bool, anchor: Path | None) -> None:
    """run.cuda_graphs against eager and the plain loop, in one call: its `gpu` tests, one
    epoch with graphs distributed and in-process, the bench with its graph variants."""
    environment(check)
    gpu_tests(check, out, "cuda_graphs")
    plain_loop(check, out, anchor)
    setups = Setups(quick)
    graphed = setups.config(GPU_EXAMPLE, "epoch-graphs", cuda_graphs=True)
    check.section("one epoch, distributed, CUDA graphs", lambda: trained(graphed, True))
    check.section("one epoch, in-process, CUDA graphs", lambda: trained(graphed, False))
    bench_gpu(check, out, quick, "bench gpu graphs", "--cuda-graphs")


def cpu_part(check: Check, out: Path, quick: bool) -> None:
    check.section("bench on the CPU cores", lambda: run_command(
        [sys.executable, "-m", "orchestration", "bench", "--device", "cpu", "--rounds",
         "1" if quick else "2", "--steps", "30" if quick else "100", "--parties", "8",
         "--json", str(out / "bench_cpu.json")], 420, out / "bench_cpu.log"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--part", choices=("gpu", "graphs", "cpu", "all"), default="all")
    parser.add_argument("--anchor", type=Path, help="the plain single-process loop's script")
    parser.add_argument("--quick", action="store_true", help="every size shrunk: a dry run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    check = Check(args.out)
    if args.part in ("gpu", "all"):
        gpu_part(check, args.out, args.quick, args.anchor)
    if args.part in ("graphs", "all"):
        graphs_part(check, args.out, args.quick, args.anchor if args.part == "graphs" else None)
    if args.part in ("cpu", "all"):
        cpu_part(check, args.out, args.quick)
    print("\n=== summary")
    for name, result in check.found.items():
        print(f"{'ok    ' if result['ok'] else 'FAILED'} {result['seconds']:7.1f} s  {name}")
    return 0 if all(r["ok"] for r in check.found.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
