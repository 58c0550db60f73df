"""The report's figures (matplotlib Agg): leak over training, per-class histograms, training curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from scipy.ndimage import uniform_filter1d  # noqa: E402

from attacker.report.leak_read import LeakLine  # noqa: E402

DPI = 110
CLASS_COLORS = {0: "tab:blue", 1: "tab:orange"}
AUC_LABEL = "per-batch leak AUC, flip-corrected\nmax(AUC, 1 − AUC)"
LINE_STYLES = ("-", "--", ":", "-.")
SMOOTH_ABOVE = 400  # batches: beyond this a line is a rolling mean over the faint per-batch values
DRAWN_AT_MOST = 2000  # points of one line: a longer one is thinned (_thin), its look kept


def _column(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def _select(table: pa.Table, **equal: Any) -> pa.Table:
    mask = None
    for name, value in equal.items():
        match = pc.equal(table.column(name), value)
        mask = match if mask is None else pc.and_(mask, match)
    return table.filter(mask)


def _save(fig: plt.Figure, path: Path) -> None:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of the finite values among the `window` around each (the ends repeated; NaN
    where there are none), in time linear in the values (a convolution took window × values,
    the window growing with the steps)."""
    if window <= 1 or values.size < window:
        return values
    finite = np.isfinite(values)
    sums = uniform_filter1d(np.where(finite, values, 0.0), window, mode="nearest")
    counts = uniform_filter1d(finite.astype(np.float64), window, mode="nearest")
    out = np.full(values.size, np.nan)
    np.divide(sums, counts, out=out, where=counts > 0.5 / window)
    return out


def _thin(steps: np.ndarray, values: np.ndarray,
          most: int = DRAWN_AT_MOST) -> tuple[np.ndarray, np.ndarray]:
    """At most `most` points of a line for drawing: a longer one keeps its first and last point
    and, of each of (`most` − 2) / 2 runs of consecutive points, its lowest and highest (in step
    order), so the drawn line spans what every point spans at a figure's resolution while its
    cost no longer grows with the steps. Only what is drawn: every table is computed from all
    the values."""
    if values.size <= most:
        return steps, values
    chunks = (most - 2) // 2
    edges = np.linspace(0, values.size, chunks + 1).astype(np.int64)
    filled = np.where(np.isnan(values), np.inf, values)  # a NaN is never a run's extreme
    low = np.minimum.reduceat(filled, edges[:-1])
    keep = [0]
    for start, stop, lowest in zip(edges[:-1], edges[1:], low, strict=True):
        if not np.isfinite(lowest):  # a run of NaNs: one of them, so the line breaks there
            keep.append(start)
            continue
        part = values[start:stop]
        keep += sorted({start + int(np.nanargmin(part)), start + int(np.nanargmax(part))})
    at = np.unique(np.asarray([*keep, values.size - 1], dtype=np.int64))
    return steps[at], values[at]


def _panel_grid(count: int, width: float, height: float) -> tuple[plt.Figure, np.ndarray]:
    ncols = min(4, count)
    nrows = -(-count // ncols)
    size = (max(width * ncols, 8.0), height * nrows + 1.0)
    fig, axes = plt.subplots(nrows, ncols, figsize=size, sharex=True, sharey=True, squeeze=False,
                             layout="constrained")
    for index, ax in enumerate(axes.flat):
        ax.set_visible(index < count)
        if index < count and index + ncols >= count:  # lowest panel of its column: label the x axis
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel("training step")
    return fig, axes


def _leak_line(ax: plt.Axes, steps: np.ndarray, values: np.ndarray, style: str, label: str) -> int:
    """One attack's line; past SMOOTH_ABOVE batches a rolling mean over faint per-batch values.
    Returns the rolling window (1: none)."""
    kept = np.isfinite(values)  # skipped batches have no value
    steps, values = steps[kept], values[kept]
    if values.size <= SMOOTH_ABOVE:
        ax.plot(steps, values, ls=style, lw=1.2, label=label)
        return 1
    window = values.size // 50
    (line,) = ax.plot(*_thin(steps, values), lw=0.5, alpha=0.25)
    ax.plot(*_thin(steps, _rolling_mean(values, window)), ls=style, lw=1.4, color=line.get_color(),
            label=label)
    return window


def leak_over_training(lines: list[LeakLine], party: int, layer: str, seed: int, path: Path,
                       bound: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Per-batch flip-corrected leak AUC (label accuracy, count error) against the step, the mean
    over draws (leak_read.leak_lines): one panel per attack family, one line per attack;
    optionally Marvell's Thm-1 AUC bound."""
    families: dict[str, list[LeakLine]] = {}
    for line in lines:
        families.setdefault(line.attack.split("(", 1)[0], []).append(line)
    fig, axes = _panel_grid(len(families), 4.0, 2.8)
    accuracy, metric, window = False, "auc", 1
    for ax, (family, members) in zip(axes.flat, families.items(), strict=False):
        for index, line in enumerate(members):
            metric = line.metric
            accuracy = metric != "auc"  # accuracy or count error: both in [0, 1], no 0.5 line
            window = max(window, _leak_line(ax, line.steps, line.values,
                                            LINE_STYLES[index % len(LINE_STYLES)],
                                            line.attack[len(family):].strip("()") or family))
        if len(members) > 1:  # the legend, titled, sits above the panel so it hides no data
            short = all(len(m.attack) - len(family) <= 8 for m in members)
            legend = ax.legend(title=family, fontsize=8, ncol=min(len(members), 3 if short else 2),
                               loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
            legend.get_title().set_fontweight("bold")
        else:
            ax.set_title(family, fontsize=10, fontweight="bold")
        if bound is not None and not accuracy:
            ax.plot(*_thin(*bound), color="black", ls="--", lw=1.0)
        if not accuracy:
            ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.set_ylim(*((-0.02, 1.02) if accuracy else (0.45, 1.02)))
        if metric == "count_error":
            ax.set_ylabel("count error Σ|n̂ − n|/2B")
        ax.grid(alpha=0.3)
    notes = [] if accuracy else ["dotted grey: 0.5 (no leak)"]
    if bound is not None and not accuracy:
        notes.append("dashed black: Marvell's per-batch Thm-1 AUC bound")
    if window > 1:
        notes.append(f"lines: {window}-batch rolling mean over the faint per-batch values")
    fig.supylabel("label accuracy" if accuracy else AUC_LABEL)
    fig.suptitle(f"Per-batch label leak over training: party {party}, {layer} layer (seed {seed})"
                 + "".join(f"\n{note}" for note in notes))
    _save(fig, path)


def _bins(values: np.ndarray) -> tuple[np.ndarray | int, bool]:
    """50 bins over the finite values, log-spaced when they are positive and span > 2 decades."""
    finite = values[np.isfinite(values)]
    if finite.size == 0 or finite.min() == finite.max():
        return 10, False
    low, high = finite.min(), finite.max()
    if low > 0 and high > 100 * low:
        return np.geomspace(low, high, 50), True
    return np.linspace(low, high, 50), False


def class_histograms(rows: pa.Table, party: int, column: str, xlabel: str, path: Path) -> None:
    """Per-class histograms of one per-row figure (norm, cosine), early vs late batches;
    one row of panels per recorded layer."""
    rows = _select(rows, party_id=party)
    layers = [layer for layer in ("cut", "first") if layer in set(_column(rows, "layer"))]
    fig, axes = plt.subplots(len(layers), 2, figsize=(10, 3.3 * len(layers) + 0.6), squeeze=False,
                             layout="constrained")
    for row_axes, layer in zip(axes, layers, strict=True):
        in_layer = _select(rows, layer=layer)
        bins, log_scale = _bins(_column(in_layer, column).astype(float))
        for ax, phase in zip(row_axes, ("early", "late"), strict=True):
            part = _select(in_layer, phase=phase)
            steps = _column(part, "step")
            for label in (0, 1):
                one = _select(part, label=label)
                x = _column(one, column).astype(float)
                x = x[np.isfinite(x)]
                name = "positive" if label else "negative"
                weights = np.full(x.size, 1.0 / max(x.size, 1))  # each class sums to 1
                ax.hist(x, bins=bins, weights=weights, histtype="stepfilled", alpha=0.45,
                        color=CLASS_COLORS[label], label=f"class {label} ({name}), n={x.size}")
            if log_scale:
                ax.set_xscale("log")
            span = f"steps {steps.min()}–{steps.max()}" if steps.size else "no batches"
            ax.set_title(f"{layer} layer, {phase} batches ({span})", fontsize=11)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("fraction of the class")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"Party {party}: {xlabel} by class, first vs last logged batches")
    _save(fig, path)


def training_curves(steps: np.ndarray, loss: np.ndarray, evals: list[dict[str, Any]], path: Path) -> None:
    """Train loss (each train step's; NaN where not logged) and test loss against the step, and
    the test AUC or accuracy if evaluated."""
    fig, axes = plt.subplots(1, 2 if evals else 1, figsize=(11 if evals else 6, 3.8), squeeze=False,
                             layout="constrained")
    ax = axes[0, 0]
    window = steps.size // 50 if steps.size > SMOOTH_ABOVE else 1
    ax.plot(*_thin(steps, loss), color="tab:blue", alpha=0.35 if window > 1 else 1.0, lw=0.8,
            label="train loss (per batch)")
    if window > 1:
        ax.plot(*_thin(steps, _rolling_mean(loss, window)), color="tab:blue", lw=1.6,
                label=f"train loss ({window}-batch mean)")
    if evals:
        test_loss = [np.nan if r.get("test_loss") is None else r["test_loss"] for r in evals]
        ax.plot([r["step"] for r in evals], test_loss, "o-",
                color="tab:red", ms=3, lw=1.2, label="test loss")
    ax.set(xlabel="training step", ylabel="loss", title="Loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if evals:
        key = "test_auc" if any(r.get("test_auc") is not None for r in evals) else "test_accuracy"
        name = "test AUC" if key == "test_auc" else "test accuracy"
        points = [(r["step"], r[key]) for r in evals if r.get(key) is not None]
        ax = axes[0, 1]
        ax.plot(*zip(*points, strict=True), "o-", color="tab:green", ms=3, lw=1.2)
        ax.set(xlabel="training step", ylabel=name, title=f"{name} (final {points[-1][1]:.4f})")
        ax.grid(alpha=0.3)
    fig.suptitle("Utility over training (label party)")
    _save(fig, path)


def reconstruction_grid(grids: list[tuple[str, dict[str, np.ndarray]]], path: Path) -> None:
    """Originals (top row) and each attack's reconstructions below, same examples per column;
    every image on the originals' scale, mapped linearly onto [0, 1] (standardised pixels, grey
    or RGB: imshow takes an RGB image only on [0, 1] and ignores vmin / vmax for it)."""
    truth = grids[0][1]["truth"]
    low, high = float(truth.min()), float(truth.max())
    span = high - low if high > low else 1.0
    columns, rows = truth.shape[0], 1 + len(grids)
    height, width = truth.shape[-2:]
    scale = 1.1 * max(1.0, 28 / max(height, width))
    fig, axes = plt.subplots(rows, columns, squeeze=False,
                             figsize=(0.12 + columns * scale * width / height * 0.9 + 1.4,
                                      rows * scale))
    labels = ["original", *(name for name, _ in grids)]
    images = [truth, *(grid["rebuilt"] for _, grid in grids)]
    for r, (label, block) in enumerate(zip(labels, images, strict=True)):
        for c in range(columns):
            ax = axes[r, c]
            picture = block[c].transpose(1, 2, 0) if block[c].shape[0] == 3 else block[c][0]
            ax.imshow(np.clip((picture - low) / span, 0.0, 1.0), cmap="gray", vmin=0.0, vmax=1.0)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"y={int(grids[0][1]['labels'][c])}", fontsize=7)
        axes[r, 0].set_ylabel(label, fontsize=7, rotation=0, ha="right", va="center")
    fig.tight_layout()
    _save(fig, path)
