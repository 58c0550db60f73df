"""The leak report: tables in the terminal and in report/report.md, plots beside them."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from splitleak.rundir import RunDir


def leak_table(summary: dict[str, Any], title: str = "label leakage") -> Table:
    table = Table(title=title)
    for column in ("party", "layer", "attack", "metric", "mean", "p95", "max", "skipped",
                   "side knowledge"):
        table.add_column(column, justify="right" if column in ("mean", "p95", "max") else "left")
    for e in sorted((e for e in summary["leak"] if e["scope"] == "run"),
                    key=lambda e: (e["party_id"], e["layer"] != "cut", e["attack"])):
        stats = e.get("flipped") or e.get("accuracy")
        metric = "leak AUC (flipped)" if e["metric"] == "auc" else "label accuracy"
        table.add_row(str(e["party_id"]), e["layer"], e["attack"], metric,
                      *(f"{stats[k]:.3f}" for k in ("mean", "p95", "max")),
                      f"{e['skipped']}/{e['batches']}", e["side_knowledge"])
    return table


def print_leak_table(console: Console, summary: dict[str, Any]) -> None:
    console.print(leak_table(summary))


def write_report(run: RunDir, summary: dict[str, Any]) -> None:
    run.report.mkdir(parents=True, exist_ok=True)
