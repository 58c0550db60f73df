"""Interleaved bench rounds: every variant once per round, per-round ratios, median and spread,
and the machine's load around each round (other load lands on both sides of a ratio)."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import bootstrap

from orchestration import zygote_client

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # the interval is a description of the rounds, so it is reproducible


def load_average() -> float:
    """The machine's 1-minute load average."""
    return os.getloadavg()[0]


# A round counts as busy when other processes took more than this share of a core on average.
BUSY_OTHER_CORES = 0.25


def cpu_clock() -> tuple[float, float, float] | None:
    """(wall s, CPU-s the machine spent busy, CPU-s of this process, its reaped children and its
    zygote with the children it forked); None where /proc/stat is missing. Their difference over
    a round is what *other* processes used: unlike the load average, it does not count the
    bench's own parties and helpers."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if fields[:1] != ["cpu"] or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    machine = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    own = sum(getattr(resource.getrusage(who), part) for who in (resource.RUSAGE_SELF,
              resource.RUSAGE_CHILDREN) for part in ("ru_utime", "ru_stime"))
    return time.monotonic(), machine, own + zygote_client.children_cpu()


MIN_CLOCK_WINDOW = 1.0  # s


def other_cores(start: tuple[float, float, float] | None,
                end: tuple[float, float, float] | None) -> float | None:
    """Cores other processes used on average between two cpu_clock() readings; None over less
    than MIN_CLOCK_WINDOW (the kernel counts in 10 ms ticks: one tick over a millisecond would
    read as ten busy cores)."""
    if start is None or end is None or end[0] - start[0] < MIN_CLOCK_WINDOW:
        return None
    return max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0]))


def default_busy_load() -> float:
    """Above this 1-minute load the machine counts as busy: half of its cores."""
    return (os.cpu_count() or 1) / 2


def interleave(variants: dict[str, Callable[[], dict[str, Any]]], rounds: int,
               on_round: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run every variant once per round, in order A B C … on even rounds and … C B A on odd ones
    (so a drift in the machine's speed lands on both sides of every pair); each variant returns
    its figures. Every round keeps the load average at its start and end, and the cores other
    processes used meanwhile."""
    names = list(variants)
    kept: list[dict[str, Any]] = []
    for index in range(rounds):
        order = names if index % 2 == 0 else names[::-1]
        record: dict[str, Any] = {"round": index, "order": order, "load_start": load_average()}
        clock = cpu_clock()
        record["variants"] = {name: variants[name]() for name in order}
        record["load_end"] = load_average()
        record["other_cores"] = other_cores(clock, cpu_clock())
        kept.append(record)
        if on_round is not None:
            on_round(record)
    return kept


def per_round_ratios(rounds: Sequence[dict[str, Any]], numerator: str, denominator: str,
                     figure: str = "steps_per_s") -> list[float]:
    """numerator / denominator of `figure`, one value per round (both measured in that round)."""
    return [r["variants"][numerator][figure] / r["variants"][denominator][figure] for r in rounds]


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of per-round values, and a 95 % percentile-bootstrap interval of the
    median (None below 3 rounds, or when every round gave the same value)."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ValueError("no rounds to summarise")
    interval = None
    if array.size >= 3 and np.ptp(array) > 0:
        ci = bootstrap((array,), np.median, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
                       rng=np.random.default_rng(BOOTSTRAP_SEED)).confidence_interval
        interval = [float(ci.low), float(ci.high)]
    return {"median": float(np.median(array)), "min": float(array.min()),
            "max": float(array.max()), "ci95": interval, "n": int(array.size),
            "values": [float(v) for v in array]}


def busy(record: dict[str, Any], threshold: float | None) -> bool:
    """Other processes took more than BUSY_OTHER_CORES during the round, or the load average at
    its start or end was above `threshold` (None: default_busy_load(), only where the other
    processes' cores were not measured)."""
    others = record.get("other_cores")
    if others is not None and others > BUSY_OTHER_CORES:
        return True
    if threshold is None:
        if others is not None:
            return False
        threshold = default_busy_load()
    return max(record["load_start"], record["load_end"]) > threshold


def busy_rounds(rounds: Sequence[dict[str, Any]], threshold: float | None) -> list[int]:
    return [r["round"] for r in rounds if busy(r, threshold)]


def describe(s: dict[str, Any], digits: int = 2) -> str:
    """`0.93 [0.82–1.01] (5 rounds, 95 % CI 0.85–0.99)`."""
    text = f"{s['median']:.{digits}f} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"
    detail = f"{s['n']} round{'s' if s['n'] != 1 else ''}"
    # With 5 rounds the 95 % interval of the median is the range itself (to a float's last bits,
    # the bootstrap's percentiles interpolate): not printed twice.
    if s["ci95"] is not None and not np.allclose(s["ci95"], [s["min"], s["max"]], rtol=1e-9,
                                                 atol=0.0):
        detail += f", 95 % CI {s['ci95'][0]:.{digits}f}–{s['ci95'][1]:.{digits}f}"
    return f"{text} ({detail})"
