"""EXACT's figures in the console and in report.md: label F1 and per-feature macro-F1."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from splitleak.markdown import fmt, md_table


def _entries(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in summary["leak"] if e["scope"] == "run" and "exact" in e]


def _rows(summary: dict[str, Any]) -> list[list[str]]:
    rows = []
    for e in _entries(summary):
        x = e["exact"]
        features = ", ".join(f"{name} {fmt(f1)}" for name, f1 in x["feature_f1"].items())
        rows.append([str(e["party_id"]), fmt(x["label_f1"]), features,
                     fmt(e["pooled"]["accuracy"]), f"{x['candidates_per_example']:,}",
                     str(e["pooled"]["rows"]), str(x["batches"]), _ties(x.get("ties"))])
    return rows


def _ties(ties: dict[str, Any] | None) -> str:
    """`25 rows; label F1 0.990–0.995; C4 0.980–0.990`: the F1 with ties counted wrong–right."""
    if ties is None:
        return "-"
    spans = [f"label F1 {fmt(ties['wrong']['label_f1'])}–{fmt(ties['right']['label_f1'])}"]
    spans += [f"{name} {fmt(f1)}–{fmt(ties['right']['feature_f1'][name])}"
              for name, f1 in ties["wrong"]["feature_f1"].items()]
    return f"{ties['rows']} rows" + ("; " + "; ".join(spans) if ties["rows"] else "")


HEADER = ["party", "label F1", "feature macro-F1", "label accuracy", "candidates / example",
          "rows", "batches", "exact ties (F1 with ties wrong–right)"]


def exact_table(summary: dict[str, Any]) -> Table | None:
    rows = _rows(summary)
    if not rows:
        return None
    table = Table(title="EXACT (white box): label and private-feature reconstruction",
                  box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="every recorded example at a snapshot step; nearest candidate in L2")
    for column in HEADER:
        table.add_column(column, justify="left" if column == "feature macro-F1" else "right")
    for row in rows:
        table.add_row(*map(escape, row))
    return table


def exact_md(summary: dict[str, Any]) -> list[str]:
    rows = _rows(summary)
    if not rows:
        return []
    return ["## EXACT (white-box feature and label reconstruction)", "",
            "Qiu et al.'s exhaustive attack: for every recorded example at a white-box snapshot step, "
            "every combination of the label party's private categorical values and the label; the "
            "candidate whose cut gradient (label party's model at that step) is nearest in L2 to "
            "the received one. Label F1 of the positive class (macro over classes if multi-class); "
            "feature F1 macro over the values present in the truth. An exact tie (several candidates "
            "at the same, minimal float32 distance) is broken by a seeded draw; the last column "
            "counts the tied rows and gives each F1 with every tie counted wrong and counted right.", "",
            *md_table(HEADER, rows), ""]
