"""Cells and tables of a markdown report: a number as text (n/a when missing), a table."""

from __future__ import annotations

import math
from typing import Any


def fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def fmt_figure(value: Any) -> str:
    """A run-level figure with its significant digits kept (δ = 1e-05, not 0.0000)."""
    if isinstance(value, float) and math.isfinite(value) and value != 0.0 and not 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}"
    return fmt(value, 4)


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return [*lines, *("| " + " | ".join(row) + " |" for row in rows), ""]


def threats_by_party(entries: list[dict[str, Any]], who: str = "party") -> str:
    """"party 1: curious; party 2: malicious" from the entries' threats, each party once ("-"
    when none is recorded); one party: its threat alone."""
    threats = {e["party_id"]: e.get("threat") or "-" for e in entries}
    if len(threats) == 1:
        return next(iter(threats.values()))
    return "; ".join(f"{who} {k}: {v}" for k, v in sorted(threats.items()))
