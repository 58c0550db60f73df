"""A distributed train step's time per role, from the timing.json every role writes."""

from __future__ import annotations

from typing import Any

from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.timing import read_cpu, read_timing

# (key, short name) in the order the bench prints them, all ms per train step; "party" is the
# slowest passive party (the busiest per step), "busy" its compute + codec (its tap runs after
# it has answered, while the label party computes).
COMPONENTS = (
    ("step", "train step"),
    ("label_compute", "label compute"),
    ("label_codec", "label encode+decode"),
    ("label_update", "label update, while parties compute"),
    ("label_waiting", "label waits for parties"),
    ("passive_compute", "party compute"),
    ("passive_codec", "party encode+decode"),
    ("passive_tap", "tapped party: tap, after answering"),
    ("passive_handoff", "party hands answer to gRPC"),
    ("transport", "transport+scheduling"),
    ("wire_floor", "gRPC round trip of a party's bytes, alone"),
    ("passive_waiting", "party waits for label"),
    ("cpu_label", "CPU: label party"),
    ("cpu_parties", "CPU: passive parties, together"),
    ("cpu_sidecar", "CPU: attacker sidecar"),
    ("cpu_system", "CPU: of which in the kernel, all"),
)
LEGEND = ("party = the slowest passive party; transport+scheduling = label waits for parties + "
          "label update - max(party busy (compute, encode+decode), label update): the update runs"
          " inside the exchange while the parties compute, so it is added back to the wait before"
          " the parties' busy time is taken off; what remains is gRPC, TLS, sockets, executor "
          "hand-offs and time the parties wait for a core; the columns are the round with the "
          "median train step, so its rows add up; CPU = user + system time of each process per "
          "train step (getrusage, every thread), on a machine shared by all of them; gRPC round "
          "trip alone = the widest party's activation and cut gradient bytes echoed between two "
          "fresh processes over the run's channel options and TLS, nothing else running (median "
          "of 200, measured after each run): the part of transport+scheduling that is the wire")


def step_budget(run: RunDir, parties: int, steps_per_s: float) -> dict[str, float]:
    """ms per train step of each component; the slowest party is the one busiest per step."""
    label = read_timing(run.label_timing)
    if not label:
        raise ValueError(f"{run.label_timing} is missing: the label party wrote no "
                         "timing")
    busiest: dict[str, float] = {}
    busy, tap = -1.0, 0.0
    for k in range(1, parties + 1):
        spans = read_timing(run.passive_timing(k))
        tap = max(tap, spans.get("tap", 0.0))
        total = sum(v for name, v in spans.items() if name not in ("wait", "write", "tap"))
        if total > busy:
            busiest, busy = spans, total
    cpu: dict[str | int, dict[str, float]]  # the roles by name, the passive parties by number
    cpu = {"label": read_cpu(run.label_timing),
           "sidecar": read_cpu(run.attacker_timing),
           **{k: read_cpu(run.passive_timing(k)) for k in range(1, parties + 1)}}

    def cpu_ms(figures: dict[str, float]) -> float:
        return figures.get("user_ms_per_step", 0.0) + figures.get("system_ms_per_step", 0.0)

    codec = label.get("encode", 0.0) + label.get("decode", 0.0)
    update = label.get("update", 0.0)
    waiting = label.get("exchange", 0.0) - codec - update
    return {
        "step": 1e3 / steps_per_s,
        "label_compute": label.get("compute", 0.0),
        "label_codec": codec,
        "label_update": update,
        "label_waiting": waiting,
        "passive_compute": busiest.get("backward", 0.0) + busiest.get("forward", 0.0),
        "passive_codec": busiest.get("encode", 0.0) + busiest.get("decode", 0.0),
        "passive_tap": tap,  # the busiest tapped party, slowest or not
        "passive_handoff": busiest.get("write", 0.0),
        "transport": waiting + update - max(busy, update, 0.0),
        "passive_waiting": busiest.get("wait", 0.0),
        "cpu_label": cpu_ms(cpu["label"]),
        "cpu_parties": sum(cpu_ms(cpu[k]) for k in range(1, parties + 1)),
        "cpu_sidecar": cpu_ms(cpu["sidecar"]),
        "cpu_system": sum(figures.get("system_ms_per_step", 0.0) for figures in cpu.values()),
    }


def median_budget(budgets: list[dict[str, Any]]) -> dict[str, float]:
    """The budget of the round with the median train step (the lower one of an even count), whole:
    per-component medians come from different rounds and would not add up."""
    ranked = sorted(budgets, key=lambda b: b["step"])
    return {key: float(ranked[(len(ranked) - 1) // 2][key]) for key, _ in COMPONENTS}
