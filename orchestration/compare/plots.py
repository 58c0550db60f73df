"""The comparison's figures (matplotlib Agg): leak vs utility per attack with CI bars and the
Pareto frontier; leak vs strength per defense family."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from orchestration.compare.trends import Trend  # noqa: E402

DPI = 110


def _err(row: dict[str, Any], prefix: str) -> tuple[float, float]:
    """Distances from the mean to the CI ends (0 where there is no interval)."""
    mean, low, high = (row.get(f"{prefix}_{k}") for k in ("mean", "ci_low", "ci_high"))
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return 0.0, 0.0
    return mean - low, high - mean


def _colors(families: list[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10")
    return {f: cmap(i % 10) for i, f in enumerate(dict.fromkeys(families))}


def leak_vs_utility(rows: list[dict[str, Any]], path: Path, leak_label: str, utility_label: str) -> None:
    """One attack: each setting at (leak, utility) seed means with 95 % CI bars; the frontier
    joins the settings no other beats on both (up and to the left is better)."""
    rows = [r for r in rows if r["leak_mean"] is not None and r["utility_mean"] is not None]
    colors = _colors([r["family"] for r in rows])
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    shown: set[str] = set()
    for row in rows:
        xerr, yerr = _err(row, "leak"), _err(row, "utility")
        ax.errorbar(row["leak_mean"], row["utility_mean"], xerr=[[xerr[0]], [xerr[1]]],
                    yerr=[[yerr[0]], [yerr[1]]], fmt="o" if row["pareto"] else "s", ms=6,
                    color=colors[row["family"]], mfc=colors[row["family"]] if row["pareto"] else "white",
                    capsize=3, lw=1, label=None if row["family"] in shown else row["family"])
        shown.add(row["family"])
    frontier = sorted((r for r in rows if r["pareto"]), key=lambda r: r["leak_mean"])
    if frontier:
        ax.step([r["leak_mean"] for r in frontier], [r["utility_mean"] for r in frontier],
                where="post", color="black", lw=1.2, ls="--", alpha=0.7, label="Pareto frontier")
    _label_points(ax, rows)
    ax.set_xlabel(f"{leak_label}\n(mean over seeds, 95 % t interval)")
    ax.set_ylabel(f"{utility_label} (mean over seeds, 95 % t interval)")
    ax.set_title(f"{rows[0]['attack'] if rows else ''}: leak vs utility (better: up and left)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _label_points(ax: plt.Axes, rows: list[dict[str, Any]]) -> None:
    """Name each setting beside its marker, moving a label up or down until it does not cover
    one already placed (settings often crowd near the no-defense corner)."""
    ax.autoscale_view()
    scale = ax.figure.dpi / 72  # points to pixels
    placed: list[tuple[float, ...]] = []
    for row in sorted(rows, key=lambda r: (-r["utility_mean"], r["leak_mean"])):
        x, y = ax.transData.transform((row["leak_mean"], row["utility_mean"]))
        width, height = len(row["setting"]) * 4.0 * scale, 8.0 * scale
        left = x + 4 * scale + width > ax.bbox.x1  # no room on the right: label to the left
        x0 = x - 4 * scale - width if left else x + 4 * scale
        for dy in (3, -11, 13, -21, 23, -31, 33, -41, 43):
            box = (x0, y + dy * scale, x0 + width, y + dy * scale + height)
            if not any(_overlaps(box, other) for other in placed):
                break
        placed.append(box)
        ax.annotate(row["setting"], (row["leak_mean"], row["utility_mean"]), fontsize=7,
                    xytext=(-4 if left else 4, dy), textcoords="offset points", color="0.25",
                    ha="right" if left else "left")


def leak_vs_strength(family_trends: list[Trend], baselines: dict[str, dict[str, Any]], path: Path,
                     leak_label: str) -> None:
    """One defense family: a panel per attack and varying parameter, the leak at each of its
    levels (a line per value of the family's other varying parameters); the dashed line is the
    same set-up without a defense."""
    by_attack: dict[tuple[str, str], list[Trend]] = defaultdict(list)
    for trend in family_trends:
        by_attack[(trend.attack, trend.parameter)].append(trend)
    count = len(by_attack)
    ncols = min(3, count)
    nrows = math.ceil(count / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), squeeze=False)
    for ax, ((attack, parameter), attack_trends) in zip(axes.flat, by_attack.items(), strict=False):
        for trend in attack_trends:
            x = np.array([v for v, _ in trend.levels])
            y = np.array([row["leak_mean"] for _, row in trend.levels])
            err = np.array([_err(row, "leak") for _, row in trend.levels]).T
            fixed = ", ".join(f"{k.split('.', 1)[-1]}={v:g}" for k, v in trend.fixed.items())
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, lw=1.2, label=fixed or "leak")
            if (x > 0).all() and x.max() / x.min() >= 10:
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xticks(x, [f"{v:g}" for v in x])
        base = baselines.get(attack)
        if base is not None and base.get("leak_mean") is not None:
            ax.axhline(base["leak_mean"], color="0.4", ls="--", lw=1, label="no defense")
        ax.set_title(attack, fontsize=9)
        ax.set_xlabel(parameter)
        ax.set_ylabel(leak_label, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[count:]:
        ax.set_visible(False)
    fig.suptitle(f"{family_trends[0].family}: leak vs strength (mean over seeds, 95 % t interval)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
