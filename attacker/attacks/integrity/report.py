"""The integrity attacks' figures in the console and in report.md: the backdoor's attack success
rate, the accuracy noisy samples or missing features cost, each next to the main-task accuracy."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from splitleak.markdown import fmt, md_table, threats_by_party

HEADER = ["party", "attack", "family", "headline", "VFLAIR AP", "test acc.", "rows", "evaluations"]


def _entries(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in summary["leak"] if e["scope"] == "run" and e["layer"] == "output"]


def _headline(figures: dict[str, Any]) -> str:
    if figures["metric"] == "asr":
        other = figures.get("asr_non_target")
        return (f"ASR {fmt(figures['value'])} (other classes {fmt(other)}) → class "
                f"{figures['target_class']}")
    affected = figures.get("noisy_accuracy", figures.get("missing_accuracy"))
    clean = figures.get("clean_accuracy_same_rows")
    paired = "" if clean is None else (
        f"; paired {fmt(figures.get('paired_drop'))}: same rows {fmt(clean)} clean → {fmt(affected)}")
    return f"drop {fmt(figures['value'])} (VFLAIR's){paired}"


def _rows(summary: dict[str, Any]) -> list[list[str]]:
    return [[str(e["party_id"]), e["attack"], e.get("family", "-"), _headline(e["integrity"]),
             fmt((e.get("ap") or {}).get("value")), fmt(e["integrity"]["test_accuracy"]),
             str(e["integrity"]["rows"]), str(e["integrity"]["evaluations"])]
            for e in _entries(summary) if "integrity" in e]


def integrity_table(summary: dict[str, Any]) -> Table | None:
    rows = _rows(summary)
    if not rows:
        return None
    table = Table(title="integrity attacks by a passive party (final evaluation)",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  caption="ASR: triggered test rows predicted as the target; drop: test accuracy "
                          "minus the affected rows' accuracy (VFLAIR's AP: it compares other "
                          "rows); paired: the same rows' clean accuracy minus theirs under the "
                          "attack (what the attack itself cost)")
    for column in ("party", "attack", "headline", "test acc."):
        table.add_column(column, justify="left" if column in ("attack", "headline") else "right")
    for row in rows:
        table.add_row(*map(escape, (row[0], row[1], row[3], row[5])))
    return table


def integrity_md(summary: dict[str, Any]) -> list[str]:
    entries = _entries(summary)
    if not entries:
        return []
    lines = ["## Integrity attacks", "",
             "A malicious passive party deviates (threat: " + threats_by_party(entries) +
             "). Every evaluation pass also scores the attack's test rows under it; the table "
             "gives the final pass. Replacement backdoor (LRB): share of the triggered rows "
             "predicted as the target class (VFLAIR's backdoor accuracy, which counts the rows "
             "already of that class), and of the rows of other classes. Noisy samples (NSB) and "
             "missing features (MF): the test accuracy minus the accuracy of the affected rows "
             "(MF: the test accuracy with those rows missing), VFLAIR's AP, which sets other rows "
             "against them; beside it the paired drop: the same rows' clean accuracy minus "
             "their accuracy under the attack, what the attack itself cost (on few rows, "
             "either moves by 1/rows per row). VFLAIR averages LRB and NSB over its "
             "evaluations: summary.json has that mean (`vflair_mean`).", ""]
    rows = _rows(summary)
    if rows:
        lines += md_table(HEADER, rows)
    failed = [f"- {e['attack']}, party {e['party_id']}: {e['error']}" for e in entries if "error" in e]
    return lines + ["", *failed, ""] if failed else lines + [""]
