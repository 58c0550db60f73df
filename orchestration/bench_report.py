"""`splitleak bench`'s summary: per-round ratios with median and spread, the step budget, load."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestration.bench_budget import COMPONENTS, LEGEND, median_budget
from orchestration.bench_rounds import (
    BUSY_OTHER_CORES,
    busy_rounds,
    default_busy_load,
    describe,
    per_round_ratios,
    spread,
)

PLAINTEXT = "distributed, plaintext"  # the variant `--plaintext` adds: no TLS on the channels
# The variants `--cuda-graphs` adds: each party's train step replayed as CUDA graphs
GRAPHED = "distributed, CUDA graphs"
GRAPHED_IN_PROCESS = "in-process, CUDA graphs"
SETUP_TITLES = {"ctr": "default set-up (synthetic CTR, batch 1024, cut width 128)",
                "cifar-resnet18": "Fu et al.'s CIFAR-10 split (ResNet-18 bottoms, batch 32, "
                                  "seeded random images)"}


def ratio_pairs(parties: list[int], names: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """The ratios the bench reports: name -> (numerator variant, denominator variant). Against
    the in-process run on 1 thread, and on as many threads as the distributed run has in all
    (`names`: the variants measured; "in-process T threads" says how many)."""
    names = names or []

    def threaded(prefix: str) -> list[tuple[str, str]]:
        """(variant, "T threads") of the variants named exactly `prefix` T threads."""
        return [(n, f"{m[1]} threads") for n in names
                if (m := re.fullmatch(re.escape(prefix) + r"(\d+) threads", n))]

    pairs = {"distributed / in-process (1 thread)": ("distributed", "in-process")}
    for name, threads in threaded("in-process "):
        pairs[f"distributed / in-process ({threads})"] = ("distributed", name)
    pairs["with sidecar / without"] = ("distributed+sidecar", "distributed")
    if PLAINTEXT in names:
        pairs["with TLS / plaintext"] = ("distributed", PLAINTEXT)
    if GRAPHED in names:
        pairs["CUDA graphs / eager, distributed"] = (GRAPHED, "distributed")
        pairs["CUDA graphs / eager, in-process (1 thread)"] = (GRAPHED_IN_PROCESS, "in-process")
        pairs["distributed / in-process, both CUDA graphs"] = (GRAPHED, GRAPHED_IN_PROCESS)
    for n in parties:
        pairs[f"distributed / in-process (1 thread), N={n}"] = (f"distributed N={n}",
                                                                f"in-process N={n}")
        for name, threads in threaded(f"in-process N={n}, "):
            pairs[f"distributed / in-process ({threads}), N={n}"] = (f"distributed N={n}", name)
    for n in parties[1:]:
        for mode in ("distributed", "in-process"):
            pairs[f"{mode} N={n} / N={parties[0]}"] = (f"{mode} N={n}", f"{mode} N={parties[0]}")
    return pairs


def summarise_rounds(rounds: list[dict[str, Any]], parties: list[int],
                     busy_load: float | None) -> dict[str, Any]:
    """The bench's JSON: every round, each variant's and ratio's median and spread, the step
    budget of the median round per distributed variant, and the busy rounds."""
    names = list(rounds[0]["variants"])
    steps_per_s = {name: spread([r["variants"][name]["steps_per_s"] for r in rounds])
                   for name in names}
    ratios = {label: spread(per_round_ratios(rounds, a, b))
              for label, (a, b) in ratio_pairs(parties, names).items()}
    budgets = {name: median_budget([r["variants"][name]["budget"] for r in rounds])
               for name in names if "budget" in rounds[0]["variants"][name]}
    distributed = [n for n in names if "budget" in rounds[0]["variants"][n]]
    critical = {name: spread([critical_ratio(r["variants"][name]["budget"]) for r in rounds])
                for name in distributed}
    floored = {name: spread([critical_ratio(r["variants"][name]["budget"], wire=True)
                             for r in rounds])
               for name in distributed}
    first_step = {name: spread(values) for name in distributed
                  if (values := [r["variants"][name].get("first_step_s") for r in rounds])
                  and None not in values}
    return {"rounds": rounds, "steps_per_s": steps_per_s, "ratios": ratios, "budget_ms": budgets,
            "step_over_critical_path": critical, "step_over_path_and_wire": floored,
            "first_step_s": first_step,
            "busy_load": busy_load if busy_load is not None or all(
                r.get("other_cores") is not None for r in rounds) else default_busy_load(),
            "busy_rounds": busy_rounds(rounds, busy_load)}


def critical_ratio(budget: dict[str, float], wire: bool = False) -> float:
    """A step's time over its critical path: the label party's compute and codec, then the
    slowest party's (they cannot overlap: each waits for the other's result), or the label
    party's own update where that is longer (it runs while the parties compute). `wire`: the
    path plus one gRPC round trip of a party's bytes alone (the wire's own floor)."""
    party = budget["passive_compute"] + budget["passive_codec"]
    path = budget["label_compute"] + budget["label_codec"] + max(party, budget.get("label_update", 0.0))
    if wire:
        path += budget["wire_floor"]
    return budget["step"] / path if path > 0 else float("nan")


def print_bench(result: dict[str, Any], console: Console) -> None:
    rounds = result["rounds"]
    setup = SETUP_TITLES.get(result.get("setup", "ctr"), result.get("setup", ""))
    table = Table(title=f"splitleak bench: {setup} on {result.get('device', 'cpu')}, "
                        f"{result['steps']} train steps a run, {len(rounds)} interleaved "
                        "round(s); median \\[min–max] over rounds")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, s in result["steps_per_s"].items():
        table.add_row(f"{name}, train steps/s", escape(describe(s, 1)))
    aims = {"with sidecar / without": " (aim >= 0.95)"}
    for label, s in result["ratios"].items():
        table.add_row(f"[bold]{escape(label)}[/]{aims.get(label, '')}, per round",
                      f"[bold]{escape(describe(s))}")
    for name, s in result.get("step_over_critical_path", {}).items():
        table.add_row(f"{name}: step / critical path (aim <= 1.1)", escape(describe(s)))
    for name, s in result.get("step_over_path_and_wire", {}).items():
        table.add_row(f"{name}: step / (critical path + gRPC round trip alone)", escape(describe(s)))
    for name, s in result.get("first_step_s", {}).items():
        table.add_row(f"{name}: time to first train step, s", escape(describe(s, 2)))
    for name, held in result.get("gpu_mib", {}).items():
        table.add_row(f"{name}: GPU memory per process, MiB",
                      ", ".join(f"{role} {mib:,.0f}" for role, mib in held.items()))
    table.add_row("raw tensor bytes per train step", f"{result['raw_bytes_per_step']:,.0f}")
    table.add_row("protobuf message bytes per train step", f"{result['protobuf_bytes_per_step']:,.0f}")
    table.add_row("socket bytes per train step (gRPC over HTTP/2)", f"{result['wire_bytes_per_step']:,.0f}")
    table.add_row("[bold]wire / raw[/] (aim <= 1.05)", f"[bold]{result['wire_over_raw']:.4f}x")
    step_ms = result["budget_ms"]["distributed"]["step"]
    for shape, ms in result.get("marvell_ms", {}).items():
        share = f" = {100 * ms / step_ms:.1f} % of the step" if shape == "1024x128" else ""
        table.add_row(f"marvell per batch, B x d = {shape} (ms)", f"{ms:.2f}{share}")
    console.print(table)
    budget = Table(title="step budget, ms per train step (of the round with the median train "
                         "step, whose rows add up; from the timers each role writes to "
                         "timing.json)")
    budget.add_column("component")
    for name in result["budget_ms"]:
        budget.add_column(name.replace("distributed", "dist."), justify="right")
    for key, text in COMPONENTS:
        budget.add_row(text, *(f"{b[key]:.1f}" for b in result["budget_ms"].values()))
    console.print(budget)
    console.print(LEGEND)
    loads = ", ".join(f"{r['load_start']:.2f}->{r['load_end']:.2f}" for r in rounds)
    console.print(f"1-minute load average at start->end of each round: {loads} (odd rounds run "
                  "the variants in reverse order; the bench's own parties raise it)")
    others = [r.get("other_cores") for r in rounds]
    measured = all(o is not None for o in others)
    if measured:
        console.print("cores used by other processes during each round: "
                      + ", ".join(f"{o:.2f}" for o in others)
                      + " (the machine's busy CPU time minus the bench's own)")
    if result["busy_rounds"]:
        why = " or ".join(([f"other processes used more than {BUSY_OTHER_CORES:g} of a core"]
                           if measured else [])
                          + ([f"1-minute load above {result['busy_load']:.1f}"]
                             if result["busy_load"] is not None else []))
        console.print(f"[yellow]warning: the machine was busy ({why}) in round(s) "
                      f"{', '.join(str(i + 1) for i in result['busy_rounds'])}: absolute steps/s "
                      "are low there; the per-round ratios compare runs of the same round, but "
                      "with more runnable processes than cores a multi-process run gets a larger "
                      "share of the CPU than one process, which favours the distributed side")
