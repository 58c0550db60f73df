"""`splitleak compare SWEEP_DIR | RUN_DIR...`: read the runs, compare, write compare/, print."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from orchestration.compare.markdown import UTILITY_LABELS
from orchestration.compare.read import RunResult, find_runs
from orchestration.compare.report import REPORT_TITLE, write_report
from orchestration.compare.table import CAPABILITY_LAYERS, Comparison, compare
from orchestration.compare.verdict import MAX_UTILITY_COST
from splitleak.arguments import output_dir_problem
from splitleak.artifacts.paths import COMPARE_DIR, CompareDir, SweepDir, is_sweep_dir
from splitleak.artifacts.run_config import written_by_a_run
from splitleak.artifacts.sweep import SweepIndexError
from splitleak.cli_common import EXIT_FAILED, BadInput


def compare_and_print(paths: list[Path], out: Path, console: Console, layer: str = "cut",
                      party: int | None = None, leak_stat: str = "flipped_p95",
                      target: float | None = None, dcs_ap: str = "vflair",
                      max_utility_cost: float = MAX_UTILITY_COST,
                      layer_asked: bool = True) -> Comparison | None:
    """Compare the runs under `paths` and write the report to `out`. A `layer` no run has a
    leak at is refused (exit 2) when it was asked for; a sweep's own comparison at the default
    layer compares at the one layer its runs measured (a model-completion sweep: bottom), and
    where they measured several others, says so and writes nothing."""
    try:
        runs, warnings = find_runs(paths)
    except (ValueError, SweepIndexError) as err:
        raise BadInput(str(err)) from None
    for warning in warnings:
        console.print(f"[yellow]{escape(warning)}[/]")
    if not runs:
        console.print("[bold red]nothing to compare:[/] no finished, analysed run")
        return None
    if not any(run.leak for run in runs):
        raise BadInput("nothing to compare: no compared run's report/summary.json has a leak "
                       f"entry ({', '.join(str(run.root) for run in runs)}); re-run `attacker "
                       "analyze` on them, with their gradient logs")
    if party is not None:
        _check_party(runs, party)
    measured = sorted({e.layer for run in runs for e in run.leak})
    if layer not in measured:
        why = (f"the compared runs measured a leak at {', '.join(measured) or 'no layer'}")
        if layer_asked:
            raise BadInput(f"--layer {layer}: {why}; give one of those")
        if len(measured) != 1:
            console.print(f"[yellow]no comparison at the {layer} layer:[/] {why} (`splitleak "
                          f"compare {' '.join(map(str, paths))} --layer LAYER`)")
            return None
        console.print(f"comparing at the {measured[0]} layer: the compared runs measured a leak "
                      f"there only, not at the {layer} layer")
        layer = measured[0]
    seen = len(warnings)
    comparison = compare(runs, layer, party, leak_stat, warnings, target, dcs_ap, max_utility_cost)
    report = write_report(comparison, out, paths)
    console.print(summary_table(comparison, console.width))
    if (others := measured_elsewhere(comparison)) is not None:
        console.print(others)
    if comparison.verdicts():
        console.print(verdict_lines(comparison))
    for warning in warnings[seen:]:  # the report has them too
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    if comparison.about_speed():  # the settings differ in [network] / [wire]: how fast too
        console.print(speed_table(comparison))
    console.print(f"trade-off report: {report}")
    return comparison


def _check_party(runs: list[RunResult], party: int) -> None:
    """Exit 2 when no run has a leak measured at passive party `party` (--party)."""
    observed = sorted({e.party for run in runs for e in run.leak})
    if party not in observed:
        raise BadInput(f"--party {party}: the compared runs measured a leak at passive parties "
                       f"{observed or 'none'}; give one of those")


def _fitted(title: str, caption: str, headers: list[str], body: list[list[str]],
            words: tuple[int, ...] = ()) -> Table:
    """Numbers never wrap (each column at least its widest cell); headers and the text
    columns `words` wrap at spaces instead."""
    table = Table(title=title, box=box.SIMPLE_HEAD, caption=caption, show_edge=False,
                  collapse_padding=True)
    for i, header in enumerate(headers):
        widest = 0 if i in words else max((len(row[i]) for row in body), default=0)
        table.add_column(header, justify="left" if i == 0 else "right", min_width=widest)
    for row in body:
        table.add_row(*row)
    return table


def _fits(table: Table, width: int) -> bool:
    console = Console(width=width)
    # Not Measurement.get: it clamps the measurement to the width asked about.
    needed: Measurement = table.__rich_measure__(console, console.options)
    return needed.minimum <= width


def summary_table(comparison: Comparison, width: int = 80) -> Group:
    """Utility, C-DCS and each attack's seed-mean leak per setting; * = on that attack's
    frontier. One table with the attacks' names when it fits `width`; else the attacks are
    numbered with a legend, over as many tables as it takes for each to fit (report.md has
    the whole table)."""
    rows = comparison.rows
    attacks = comparison.attacks()
    metrics = {r["utility_metric"] for r in rows}
    utility = UTILITY_LABELS.get(metrics.pop(), "utility") if len(metrics) == 1 else "utility"
    seeds = {len(s.runs) for s in comparison.settings}
    first_cells, leak_cells = [], []
    for setting in comparison.settings:
        own = {r["attack"]: r for r in rows if r["setting_key"] == setting.key}
        if not own:
            continue
        value = next(iter(own.values()))["utility_mean"]
        # report.md's C-DCS: over VFLAIR's attacks at every layer measured (model completion's
        # bottom too), not only the compared layer's
        c_dcs = next((r["c_dcs_mean"] for r in [*comparison.capability, *own.values()]
                      if r["setting_key"] == setting.key and r["in_t_dcs"]), None)
        first_cells.append([_unbroken(setting.label), *([str(len(setting.runs))] if len(seeds) > 1 else []),
                            f"{value:.4f}" if value is not None else "-",
                            f"{c_dcs:.3f}" if c_dcs is not None else "-"])
        failed = comparison.premise_failed
        leak_cells.append([_leak_cell(own.get(a), setting.label in failed.get(a, {}))
                           for a in attacks])
    first = ["setting", *(["seeds"] if len(seeds) > 1 else []), utility, "C-DCS"]
    each = f"{next(iter(seeds))} seed(s) each; " if len(seeds) == 1 else ""
    left_out = [a for a in attacks if any(not r["in_t_dcs"] for r in rows if r["attack"] == a)]
    counts = "; count attacks: mean count error, lower = more leak, no frontier" if any(
        not r["ranked"] for r in rows) else ""
    caption = (f"{each}leak: {comparison.leak_stat} (accuracy-type attacks: accuracy; "
               f"reconstruction: SSIM or R²{counts}); * = on the Pareto frontier; C-DCS: VFLAIR's, from "
               f"the {comparison.dcs_ap} attack performance, over its attacks at every layer measured "
               f"of {', '.join(CAPABILITY_LAYERS)}"
               + (f"; not in C-DCS (diagnostics, attacks VFLAIR lacks): {escape(', '.join(left_out))}"
                  if left_out else "")
               + _blank_words([cell for cells in leak_cells for cell in cells])
               + ". Full report with CIs and DCS: report.md")
    title = "trade-off (mean over seeds)"

    def part(columns: range, numbered: bool, note: str, title: str = title) -> Table:
        names = [f"A{i + 1}" if numbered else escape(attacks[i]) for i in columns]
        body = [[*head, *(cells[i] for i in columns)] for head, cells in zip(first_cells, leak_cells,
                                                                                strict=True)]
        legend = "; ".join(f"A{i + 1} = {escape(attacks[i])}" for i in columns) + ". " if numbered else ""
        return _fitted(title, legend + note, [*first, *names], body, words=(0,))

    whole = part(range(len(attacks)), False, caption)
    if _fits(whole, width):
        return Group(whole)
    # Too wide with the attacks' names as headers: number them, with a legend, and split the
    # attack columns over as many tables as it takes.
    groups, start = [], 0
    while start < len(attacks):
        stop = start + 1
        while stop < len(attacks) and _fits(part(range(start, stop + 1), True, ""), width):
            stop += 1
        groups.append(range(start, stop))
        start = stop
    if len(groups) == 1:
        return Group(part(groups[0], True, caption))
    return Group(*(part(columns, True, caption if i == len(groups) else "", f"{title}, {i}/{len(groups)}")
                   for i, columns in enumerate(groups, start=1)))


def _leak_cell(row: dict[str, Any] | None, skipped: bool) -> str:
    """A setting's seed-mean leak of an attack, * on the frontier; `skipped` where the attack
    was not scored in the setting's runs (the warnings give why), - where no figure is."""
    if row is not None and row["leak_mean"] is not None:
        return f"{row['leak_mean']:.3f}{'*' if row['pareto'] else ''}"
    return "skipped" if skipped else "-"


def _blank_words(cells: list[str]) -> str:
    """What the table's cells without a figure mean, for those it has."""
    words = {"skipped": "skipped = not scored in the setting's runs (why: the warnings below)",
             "-": "- = not measured"}
    return "".join(f"; {line}" for cell, line in words.items() if cell in cells)


def _unbroken(label: str) -> str:
    """The label with its [hash] suffix (several set-ups of one name) kept on its line: a
    wrapped suffix read as a row of its own, leaving identical names."""
    return escape(label.replace(" [", "\u00a0["))


def verdict_lines(comparison: Comparison) -> str:
    """The report's verdicts, one line per attack."""
    lines = [f"[bold]verdict[/]: the lowest leak on the Pareto frontier at ≤ "
             f"{comparison.max_utility_cost:g} utility cost against no defense"]
    lines += [f"  {escape(v.sentence())}" for v in comparison.verdicts()]
    lines += [f"  [yellow]{escape(line)}[/]" for line in comparison.left_out_line()]
    return "\n".join(lines)


def speed_table(comparison: Comparison) -> Table:
    """Per setting: its network, ms per step, seconds to the target, KiB per step."""
    body = []
    for setting in comparison.settings:
        pace = comparison.speed[setting.key]
        kib = pace["kib_per_step"]
        body.append([escape(setting.label), escape(setting.first.network(compact=True)),
                     _seconds(pace["ms_per_step_mean"], "{:.1f}"),
                     _seconds(pace["seconds_to_target_mean"], "{:.1f}"),
                     f"{kib:,.0f}" if kib is not None else "-"])
    target = comparison.speed_target
    headers = ["setting", "network", "ms/step",
               f"s to {target:.3f}" if target is not None else "s to target", "KiB"]
    return _fitted("speed (mean over seeds)", "ms/step: median train step; s to: seconds until "
                   "an evaluation reached the utility every run reached; KiB: per train step, protobuf "
                   "bytes both ways at the label party; each setting's wire: report.md",
                   headers, body, words=(1,))


def _seconds(value: float | None, form: str) -> str:
    return form.format(value) if value is not None else "-"


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        raise BadInput(f"no such directory: {', '.join(missing)}")
    single_sweep = len(args.paths) == 1 and is_sweep_dir(args.paths[0])
    out = args.output_dir or (SweepDir(args.paths[0]).compare if single_sweep else Path(COMPARE_DIR))
    if (problem := output_dir_problem(out) or _foreign(out)) is not None:
        raise BadInput(f"cannot write the report to {out}: {problem}")
    comparison = compare_and_print(args.paths, out, console, args.layer, args.party, args.leak_stat,
                                   args.target_utility, args.dcs_ap, args.max_utility_cost)
    return 0 if comparison is not None else EXIT_FAILED


def _foreign(out: Path) -> str | None:
    """Why `out` is not compare's to write: it is, or lies inside, a run directory (whose own
    report.md the comparison's would replace), or holds a report.md compare did not write."""
    for folder in (out.resolve(), *out.resolve().parents):
        if written_by_a_run(folder):
            return (f"{folder} is a run directory (its config.toml has the header a run writes): "
                    "the comparison goes outside every run directory, where it cannot replace a "
                    "run's own files (its report/report.md)")
    report = CompareDir(out).report
    if report.is_file() and not _opens_with(report, REPORT_TITLE):
        return (f"{report} is not a report `splitleak compare` wrote (it does not open with "
                f"\"{REPORT_TITLE}\"); give another directory, or move it away")
    return None


def _opens_with(path: Path, title: str) -> bool:
    try:
        with path.open(encoding="utf-8", errors="replace") as file:
            return file.readline().rstrip("\n") == title
    except OSError:
        return False


def measured_elsewhere(comparison: Comparison) -> Table | None:
    """The settings the trade-off table leaves out because none of their attacks is measured
    at its layer (e.g. a scenario of integrity attacks only, scored at the output), with their
    utility, C-DCS and attacks from the capability rows; None when every setting is in it."""
    compared = {r["setting_key"] for r in comparison.rows}
    table = Table(title=f"settings with no leak at the {comparison.layer} layer (mean over seeds)",
                  box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True,
                  caption="their attacks are measured at another layer; each attack's DCS and "
                          "T-DCS: report.md, Defense capability")
    for header in ("setting", "utility", "C-DCS", "attacks (layer)"):
        table.add_column(header, justify="right" if header in ("utility", "C-DCS") else "left")
    for setting in comparison.settings:
        own = [r for r in comparison.capability
               if r["setting_key"] == setting.key and not r["diagnostic"]]
        if setting.key in compared or not own:
            continue
        utility, c_dcs = own[0]["utility_mean"], own[0]["c_dcs_mean"]
        table.add_row(escape(setting.label), "-" if utility is None else f"{utility:.4f}",
                      "-" if c_dcs is None else f"{c_dcs:.3f}",
                      escape(", ".join(f"{r['attack']} ({r['layer']})" for r in own)))
    return table if table.row_count else None
