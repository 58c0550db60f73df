"""Where each role computes: its device (`run.device`, per-role `run.devices`) and CPU threads.

Roles are named as in `training.optimizers`: "label", a passive party id "1".."N", and
"attacker" (the sidecar's offline analysis). "auto" is CUDA where torch sees a GPU, else the
CPU; each role resolves it on its own host. What crosses the wire is the same bytes either way.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable

import torch

from splitleak.config import ConfigError, ExperimentConfig

LABEL, ATTACKER = "label", "attacker"
# Set by an engine that runs several runs at once: the cores one run may use (a sweep's local
# engine), or the threads one role may use (a Ray role, which holds its bundle's CPUs).
CORES_ENV, THREADS_ENV = "SPLITLEAK_CORES", "SPLITLEAK_THREADS"
DETERMINISTIC_CUBLAS = ":4096:8"  # cuBLAS's workspace setting for reproducible results


def requested_device(cfg: ExperimentConfig, role: str) -> str:
    return cfg.run.devices.get(role, cfg.run.device)


def _field(cfg: ExperimentConfig, role: str) -> str:
    return f"run.devices.{role}" if role in cfg.run.devices else "run.device"


def resolve_device(name: str, field: str = "run.device") -> torch.device:
    """The device `name` means on this host; ConfigError naming `field` when it has none."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            built = "a CUDA build" if torch.version.cuda else "a CPU-only build"
            raise ConfigError(f"{field} = {name!r}, but this machine has no CUDA device (torch "
                              f"{torch.__version__} is {built}); allowed here: 'cpu' or 'auto'")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{field} = {name!r}, but this machine has {count} CUDA "
                              f"device(s): cuda:0..cuda:{count - 1}")
    return device


def roles(cfg: ExperimentConfig) -> list[str]:
    return [LABEL, *(str(k) for k in range(1, cfg.topology.passive_parties + 1)), ATTACKER]


def check_devices(cfg: ExperimentConfig) -> None:
    """Every role's device exists here (a run on this machine): ConfigError names the field."""
    allowed = set(roles(cfg))
    strangers = sorted(set(cfg.run.devices) - allowed)
    if strangers:
        raise ConfigError(f"run.devices has unknown role {strangers}; allowed keys: "
                          f"{', '.join(sorted(allowed))}")
    for role in roles(cfg):
        resolve_device(requested_device(cfg, role), _field(cfg, role))


def role_device(cfg: ExperimentConfig, role: str) -> torch.device:
    """Resolve `role`'s device and set this process up for it. On CUDA: torch's deterministic
    algorithms when run.deterministic (an op without one warns and runs as it is: the adaptive
    average pool's backward, which is exact at the 1×1 pooling of a ResNet), cuDNN's autotuner
    otherwise. The CPU needs nothing: its results do not vary from run to run."""
    device = resolve_device(requested_device(cfg, role), _field(cfg, role))
    if device.type != "cuda":
        return device
    if cfg.run.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_CUBLAS)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True
    if device.index is None:  # "cuda": the current device, named
        return torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    return device


def cores() -> int:
    """The cores this run may use: SPLITLEAK_CORES where an engine shares the machine among
    runs, else every core this process may run on."""
    given = os.environ.get(CORES_ENV, "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def role_threads(cfg: ExperimentConfig, role: str, available: int | None = None) -> int:
    """`role`'s intra-op threads: run.torch_threads, or with "auto" the cores shared among the
    run's processes by their part of a step's compute (the label party weighs 2, each passive
    party 1; the sidecar, which mostly writes, takes 1 core off the top). Never more threads
    than cores in all, except that every process has at least one. The in-process reference
    runs each role's part on that role's threads, so its numbers are the distributed run's:
    a convolution's sums do depend on how many threads share them."""
    if cfg.run.torch_threads != "auto":
        return int(cfg.run.torch_threads)
    given = os.environ.get(THREADS_ENV, "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    total = available or cores()
    if role == ATTACKER:
        return 1
    n = cfg.topology.passive_parties
    weights = {LABEL: 2.0, **{str(k): 1.0 for k in range(1, n + 1)}}
    budget = max(0, total - (1 if cfg.sidecar_needed else 0))
    shares = {r: budget * w / sum(weights.values()) for r, w in weights.items()}
    threads = {r: math.floor(s) for r, s in shares.items()}
    for r in sorted(shares, key=lambda r: (threads[r] - shares[r], r))[: budget - sum(threads.values())]:
        threads[r] += 1  # the largest remainders take the cores left over
    return max(1, threads[role])


def label_core_free(cfg: ExperimentConfig) -> bool:
    """Whether the label party has a core of its own while the parties compute: a core for
    every process of the run (label party, passive parties, sidecar). Then it runs the backward
    pass to its own parameters there, after sending the cut gradients (`split_backward`);
    on fewer cores that pass would take a core from a party (2 cores, N = 2: no faster,
    docs/measurements/2026-11-26-label-update-2core.md)."""
    processes = 1 + cfg.topology.passive_parties + (1 if cfg.sidecar_needed else 0)
    return cores() >= processes


def prepare_role(cfg: ExperimentConfig, role: str) -> torch.device:
    """Threads and device of this process, for `role`; returns the device."""
    torch.set_num_threads(role_threads(cfg, role))
    return role_device(cfg, role)


def autocast(precision: str,
             device: torch.device) -> Callable[[], contextlib.AbstractContextManager[object]]:
    """training.precision as a context factory: bf16 runs the models under autocast."""
    if precision == "bf16":
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext


def settle(device: torch.device) -> None:
    """Wait for the device's queued work: a compute span then ends when its results exist."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_facts(device: torch.device) -> dict[str, float]:
    """The most GPU memory this process held (MiB), for its timing.json; {} on the CPU."""
    if device.type != "cuda":
        return {}
    return {"gpu_max_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20,
            "gpu_max_reserved_mib": torch.cuda.max_memory_reserved(device) / 2**20}
