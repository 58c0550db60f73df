"""A child for the zygote tests: `python -m tests.zygote_probe MODE [ARG]` (run as a module so
that it runs the same whether forked from the zygote or started anew)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main(mode: str, arg: str = "") -> int:
    if mode == "report":  # what the child sees of its place
        print(f"cwd={os.getcwd()} probe={os.environ.get('ZYGOTE_PROBE')} "
              f"leader={os.getsid(0) == os.getpid()} argv={sys.argv[1:]}", flush=True)
        return 0
    if mode == "plugins":  # the plug-ins installed on the child's path (its PYTHONPATH)
        from splitleak.datasets import DATASETS

        print(f"datasets={','.join(DATASETS.names())}", flush=True)
        return 0
    if mode == "gc":  # how many inherited objects the child's collections pass over
        import gc

        print(f"frozen={gc.get_freeze_count()}", flush=True)
        return 0
    if mode == "exit":
        return int(arg)
    if mode == "message":
        sys.exit(arg)
    if mode == "sleep":
        time.sleep(float(arg))
        return 0
    if mode == "cuda":  # a forked child computes on the GPU (the zygote never touched CUDA)
        import torch

        x = torch.arange(4.0, device=arg or "cuda")
        print(f"cuda sum={float((x * x).sum())}", flush=True)
        return 0
    if mode == "nested":  # a forked child starts its own child through the same zygote
        from orchestration.processes import spawn

        child = spawn("grandchild", ["tests.zygote_probe", "exit", "3"], Path(arg))
        print(f"nested pid={child.process.pid} code={child.process.wait(60)}", flush=True)
        return 0
    raise ValueError(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
