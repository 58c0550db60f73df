"""Feature reconstruction's figures in the console and in report.md: SSIM / MSE (images) or
per-feature R² / accuracy (tables) of each attack, next to the prior baseline, the image grid, and
the input protection the victims trained with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.markup import escape
from rich.table import Table

from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.records import read_protection
from splitleak.markdown import fmt, md_table, threats_by_party

GRID_FILE = "reconstruction_party{party}.png"


def _entries(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in summary["leak"] if e["scope"] == "run" and e["layer"] == "input"]


def _rows(summary: dict[str, Any], ap: bool = False) -> list[list[str]]:
    """One row per attack and victim; `ap`: with VFLAIR's attack performance (report.md), else
    with its CPU seconds (the terminal: report.md is the same for every analysis of a run)."""
    rows = []
    for e in _entries(summary):
        if "error" in e:
            continue
        r = e["reconstruction"]
        prior = r["prior"]
        if r["metric"] == "ssim":
            cells = [fmt(r["ssim"]), fmt(prior["ssim"]), fmt(r["mse"]), fmt(prior["mse"]),
                     fmt((r.get("ssim_standardised") or {}).get("ssim"))]
        else:
            worst = ", ".join(f"{k} {fmt(v)}" for k, v in {**r["r2"], **r["accuracy"]}.items())
            cells = [f"{r['metric']} {fmt(r['value'])}", f"{fmt(prior['value'])}",
                     fmt(r.get("mse")), worst or "-", "-"]
        rows.append([str(e["party_id"]), e["attack"], *cells, str(r["rows"]),
                     str(r.get("auxiliary_rows", "-"))]
                    + ([fmt((e.get("ap") or {}).get("value"))] if ap  # report.md: no timing
                       else [fmt(r.get("cpu_seconds"), 0)]))
    return rows


HEADER = ["victim", "attack", "SSIM (class-cond.)", "prior SSIM", "MSE", "prior MSE",
          "SSIM standardised (diagnostic)", "rows", "auxiliary rows"]
TABULAR = ["victim", "attack", "headline", "prior", "MSE", "per feature (R² / accuracy)", "",
           "rows", "auxiliary rows"]
DIAGNOSTIC = 6  # the standardised SSIM's column: report.md only


def _images(summary: dict[str, Any]) -> bool:
    return any(e.get("metric") == "ssim" for e in _entries(summary))


def _header(summary: dict[str, Any], ap: bool = False) -> list[str]:
    return (HEADER if _images(summary) else TABULAR) + (["VFLAIR AP (1 − MSE₀₁)"] if ap else ["CPU s"])


HOW = {
    "inversion": "Inversion (white box): Adam on ‖f_k(x̂) − h‖² + λ·TV(x̂) from the train mean, "
                 "per received activation of the last recorded epoch.",
    "back_mapping": "Back-mapping (VFLAIR's TBM): an MLP decoder trained on the auxiliary rows' "
                    "(activation, features), applied to the received activations of the last "
                    "recorded epoch.",
    "grn": "GRN (Luo et al.): a generator from the label party's own features and noise, trained "
           "so that the trained model's output on its features matches the output on the real "
           "ones; scored on test rows, prior = the train mean.",
    "cafe": "CAFE (Jin et al.): dummy first-layer gradients, first-layer inputs and data of every "
            "row, fitted to the victim's aggregated parameter gradients per snapshot step; scored "
            "on the rows it saw, prior = the train mean; PSNR as in the paper.",
}


CONSOLE = {"victim": "party", "SSIM (class-cond.)": "SSIM", "prior SSIM": "prior",
           "prior MSE": "prior", "auxiliary rows": "aux.", "headline": "value",
           "per feature (R² / accuracy)": "per feature"}  # short headers: 80 columns


def _without_diagnostic(cells: list[str]) -> list[str]:
    return cells[:DIAGNOSTIC] + cells[DIAGNOSTIC + 1:]


def reconstruction_table(summary: dict[str, Any]) -> Table | None:
    rows = _rows(summary)
    if not rows:
        return None
    images = _images(summary)  # else tabular victims only: no SSIM to explain
    table = Table(title="feature reconstruction by the label party (received activations)",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  caption=("SSIM: class-conditional, on [0, 1] pixels (data range 1); " if images
                           else "") + "prior: every row rebuilt as the mean of the attacker's "
                                      "auxiliary (aux.) rows")
    for i, column in enumerate(_header(summary)):
        if i == DIAGNOSTIC:
            continue
        wide = column in ("attack", "per feature (R² / accuracy)")
        table.add_column(CONSOLE.get(column, column), justify="left" if wide else "right",
                         no_wrap=column == "attack")
    for row in rows:
        table.add_row(*map(escape, _without_diagnostic(row)))
    return table


def reconstruction_md(summary: dict[str, Any]) -> list[str]:
    entries = _entries(summary)
    if not entries:
        return []
    failed = [f"- {e['attack']}, victim {e['party_id']}: {e['error']}" for e in entries if "error" in e]
    threat = threats_by_party(entries, "victim")
    names = dict.fromkeys(e["name"] for e in entries if "name" in e)
    lines = ["## Feature reconstruction", "",
             f"Threat: {threat}. " + " ".join(HOW[n] for n in names if n in HOW) +
             " SSIM per image as the papers compute it (scikit-image, uniform 7×7 window or the "
             "largest that fits, on [0, 1] pixels with data range 1, the reconstruction clipped to "
             "[0, 1]), averaged per class, then over classes; MSE in standardised units; MSE₀₁ on "
             "those [0, 1] pixels, or tabular features scaled to [0, 1] by their range (VFLAIR's "
             "scale: its AP is 1 − MSE₀₁). *SSIM standardised* is a diagnostic only: the same on the "
             "party's standardised pixels with the truth's range as data range (splitleak's figure "
             "before), which a paper's SSIM cannot be set beside. Prior: every row rebuilt as the "
             "mean of the attacker's auxiliary rows (inversion, back-mapping) or of the train rows "
             "(GRN, CAFE): what a constant guess achieves.", ""]
    rows, header = _rows(summary, ap=True), _header(summary, ap=True)
    if not _images(summary):  # tables of features: no standardised-SSIM diagnostic
        rows, header = [_without_diagnostic(r) for r in rows], _without_diagnostic(header)
    if rows:
        lines += md_table(header, rows)
    lines += [f"\nCAFE's own metric (victim {e['party_id']}): PSNR {fmt(r['psnr'], 2)} dB, prior "
              f"{fmt(r['psnr_prior'], 2)} dB ({r['iterations']} iterations over {r['snapshots']} "
              f"recorded steps, gradient match {fmt(r['gradient_match_first'])} → "
              f"{fmt(r['gradient_match_last'])})."
              for e in entries if (r := e.get("reconstruction") or {}).get("psnr") is not None]
    return lines + ["", *failed, ""] if failed else lines + [""]


def protection_md(run: RunDir, config: dict[str, Any]) -> list[str]:
    """What each protecting party did to its train images (its protection.json), or nothing."""
    protection = config.get("protection") or {}
    parties = protection.get("parties") or []
    if protection.get("name", "none") == "none" or not parties:
        return []
    lines = ["## Input protection", "",
             f"{protection['name']} on party {', '.join(map(str, parties))}: each train image is "
             "replaced once, before training, by its protected version; test images stay real, so "
             "the test metric is the protection's utility (ADR: `splitleak compare` against the "
             "same set-up without it). Window variance: mean over s×s windows (v_e is the target); "
             "pixel spread: mean over pixels of the standard deviation across images (near 0: the "
             "generator ignores its noise, every protected image gets the same pattern).", ""]
    rows, missing = [], []
    for k in parties:
        written = read_protection(run, int(k))
        if written is None:
            missing.append(f"- party {k}: no readable {run.protection(int(k)).name} (the party did "
                           "not finish protecting)")
            continue
        f = written.as_dict()
        var, spread, losses = f["window_variance"], f["pixel_spread"], f["final_losses"]
        rows.append([str(k), str(f["rows"]), f"{fmt(var['real'])} / {fmt(var['generated'])} / "
                     f"{fmt(var['mixed'])}", f"{fmt(spread['real'])} / {fmt(spread['generated'])}",
                     f"{fmt(losses['discriminator'])} / {fmt(losses['generator'])} / "
                     f"{fmt(losses['obfuscation'])}", fmt(f["cpu_seconds"], 1)])
    if rows:
        lines += md_table(["party", "images", "window variance real / generated / mixed",
                           "pixel spread real / generated", "final loss D / G / obfuscation",
                           "CPU s"], rows)
    return lines + [*missing, ""] if missing else lines


def grids(run: RunDir, summary: dict[str, Any],
          where: Callable[[Path], Path | None] = lambda p: p) -> list[tuple[str, str, list[tuple[str, Any]]]]:
    """One grid per victim, for report.md's Plots: (file name, caption, [(attack, its saved
    originals and reconstructions)]); `where`: where the summary's analysis wrote a run's grid
    file (its staging, until it is swapped in)."""
    by_party: dict[int, list[tuple[str, Path]]] = {}
    for e in _entries(summary):
        path = where(run.reconstruction_grid(e["attack"].split("(")[0], e["party_id"]))
        if "error" not in e and e.get("metric") == "ssim" and path is not None and path.exists():
            by_party.setdefault(e["party_id"], []).append((e["attack"].split("(")[0], path))
    return [(GRID_FILE.format(party=party), f"Reconstructed inputs of party {party}: originals "
             "(top) and each attack's reconstruction, same rows",
             [(name, dict(np.load(path))) for name, path in files])
            for party, files in sorted(by_party.items())]
