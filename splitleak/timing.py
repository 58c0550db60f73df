"""Step-time budget: cheap perf_counter spans a role sums per phase and writes as its timing
(splitleak.artifacts.timing)."""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from splitleak.artifacts.timing import Timing, write_timing

# Train steps before this one are not timed: the first contact, allocations and autograd's
# first passes are warm-up, and the first wait holds the whole set-up.
WARMUP_STEPS = 5


_STARTUP: dict[str, float] = {}  # this process's start-up milestones (wall clock)
_FACTS: dict[str, object] = {}  # what this process ran on: device, threads


def mark_startup(name: str) -> None:
    """When this process reached a start-up milestone (the first time only), e.g. `serving`,
    `joined`, `first_step`: `splitleak bench` sets them against the run's launch."""
    _STARTUP.setdefault(name, time.time())


def note(**facts: object) -> None:
    """Facts about this process for its timing.json (e.g. device = "cuda:0", threads = 4)."""
    _FACTS.update(facts)


def timed(train: bool, step: int) -> bool:
    """Whether a batch's spans count: a train step past the warm-up."""
    return train and step >= WARMUP_STEPS


def _cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread: gRPC's and torch's too
    return usage.ru_utime, usage.ru_stime


class CpuWindow:
    """This process's CPU time (user, system) from the first to the last timed event."""

    def __init__(self) -> None:
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None

    def mark(self) -> None:
        now = _cpu()
        if self.first is None:
            self.first = now
        self.last = now

    def per_step(self, steps: int) -> dict[str, float]:
        """ms of user and system CPU per train step ({} before two marks or without steps)."""
        if self.first is None or self.last is None or not steps:
            return {}
        return {"user_ms_per_step": 1e3 * (self.last[0] - self.first[0]) / steps,
                "system_ms_per_step": 1e3 * (self.last[1] - self.first[1]) / steps}


class StepTimer:
    """Total seconds and count per span name (e.g. `compute`, `encode`, `wait`) over the train
    steps past the warm-up (`timed`), and the process's CPU time over them; two perf_counter and
    two getrusage calls per span, so it stays on in every run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.cpu = CpuWindow()

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.counts[name] = self.counts.get(name, 0) + 1

    @contextmanager
    def span(self, name: str, on: bool = True) -> Iterator[None]:
        """Time the block under `name`; `on=False` (e.g. an evaluation batch) times nothing."""
        if not on:
            yield
            return
        if self.cpu.first is None:
            self.cpu.mark()
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)
            self.cpu.mark()

    def as_dict(self, per: str) -> dict:
        """Seconds and counts per span, and the mean milliseconds per train step; the train
        steps are counted by span `per` (one per step, e.g. the label's `compute`)."""
        steps = self.counts.get(per, 0)
        return {"train_steps": steps,
                "spans": {name: {"seconds": s, "count": self.counts[name],
                                 "ms_per_step": 1e3 * s / steps if steps else 0.0}
                          for name, s in sorted(self.seconds.items())},
                "cpu": self.cpu.per_step(steps), "startup": dict(_STARTUP), **_FACTS}

    def write(self, path: Path, per: str) -> None:
        write_timing(path, Timing.model_validate(self.as_dict(per)))


def write_cpu(path: Path, cpu: CpuWindow, steps: int) -> None:
    """timing.json of a role without spans (the sidecar): its CPU per train step."""
    write_timing(path, Timing.model_validate({"train_steps": steps, "spans": {},
                                              "cpu": cpu.per_step(steps),
                                              "startup": dict(_STARTUP), **_FACTS}))
