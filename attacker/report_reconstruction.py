"""Feature reconstruction's figures in the console and in report.md: SSIM / MSE (images) or
per-feature R² / accuracy (tables) of each attack, next to the prior baseline, and the image grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.markup import escape
from rich.table import Table

from attacker.report_threat import fmt, md_table
from splitleak.rundir import RunDir

GRID_FILE = "reconstruction_party{party}.png"


def _entries(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in summary["leak"] if e["scope"] == "run" and e["layer"] == "input"]


def _rows(summary: dict[str, Any]) -> list[list[str]]:
    rows = []
    for e in _entries(summary):
        if "error" in e:
            continue
        r = e["reconstruction"]
        prior = r["prior"]
        if r["metric"] == "ssim":
            cells = [fmt(r["ssim"]), fmt(prior["ssim"]), fmt(r["mse"]), fmt(prior["mse"])]
        else:
            worst = ", ".join(f"{k} {fmt(v)}" for k, v in {**r["r2"], **r["accuracy"]}.items())
            cells = [f"{r['metric']} {fmt(r['value'])}", f"{fmt(prior['value'])}",
                     fmt(r.get("mse")), worst or "-"]
        rows.append([str(e["party_id"]), e["attack"], *cells, str(r["rows"]),
                     str(r["auxiliary_rows"]), fmt(r.get("cpu_seconds"), 0)])
    return rows


HEADER = ["victim", "attack", "SSIM (class-cond.)", "prior SSIM", "MSE", "prior MSE", "rows",
          "auxiliary rows", "CPU s"]
TABULAR = ["victim", "attack", "headline", "prior", "MSE", "per feature (R² / accuracy)", "rows",
           "auxiliary rows", "CPU s"]


def _header(summary: dict[str, Any]) -> list[str]:
    images = any(e.get("metric") == "ssim" for e in _entries(summary))
    return HEADER if images else TABULAR


def reconstruction_table(summary: dict[str, Any]) -> Table | None:
    rows = _rows(summary)
    if not rows:
        return None
    table = Table(title="feature reconstruction from received activations (label party as attacker)",
                  box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="prior: every row rebuilt as the mean of the attacker's auxiliary rows")
    for column in _header(summary):
        table.add_column(column, justify="left" if column in ("attack", "per feature (R² / accuracy)")
                         else "right")
    for row in rows:
        table.add_row(*map(escape, row))
    return table


def reconstruction_md(summary: dict[str, Any]) -> list[str]:
    entries = _entries(summary)
    if not entries:
        return []
    failed = [f"- {e['attack']}, victim {e['party_id']}: {e['error']}" for e in entries if "error" in e]
    first = next((e for e in entries if "reconstruction" in e), None)
    threat = first["threat"] if first else entries[0].get("threat", "")
    lines = ["## Feature reconstruction", "",
             f"Threat: {threat}. The victims' rows are train rows of the last recorded epoch outside "
             "the attacker's auxiliary rows, each reconstructed from the activation the label party "
             "received. Inversion (white box): Adam on ‖f_k(x̂) − h‖² + λ·TV(x̂) from the train mean. "
             "Back-mapping: an MLP decoder trained on the auxiliary rows' (activation, features). "
             "SSIM per image (scikit-image, on the standardised features' range), averaged per class, "
             "then over classes; MSE in standardised units. Prior: every row rebuilt as the mean "
             "auxiliary row (what the attacker knows without the activations).", ""]
    rows = _rows(summary)
    if rows:
        lines += md_table(_header(summary), rows)
    return lines + ["", *failed, ""] if failed else lines + [""]


def draw_grids(run: RunDir, summary: dict[str, Any], figure: Any) -> None:
    """One grid per victim: originals and each attack's reconstructions (report.md's Plots)."""
    from attacker import plots

    by_party: dict[int, list[tuple[str, Path]]] = {}
    for e in _entries(summary):
        path = run.attacker / "reconstruction" / f"{e['attack'].split('(')[0]}_party{e['party_id']}.npz"
        if "error" not in e and e.get("metric") == "ssim" and path.exists():
            by_party.setdefault(e["party_id"], []).append((e["attack"].split("(")[0], path))
    for party, files in sorted(by_party.items()):
        grids = [(name, dict(np.load(path))) for name, path in files]
        figure(GRID_FILE.format(party=party), f"Reconstructed inputs of party {party}: originals "
               "(top) and each attack's reconstruction, same rows", plots.reconstruction_grid, grids)
