"""`splitleak soak`'s report without running it: RSS growth is measured over the settled run,
never from a process's start-up, and the options it cannot honour are refused before any work."""

from __future__ import annotations

import io

from rich.console import Console

from orchestration.soak import print_report, rss_growth


def test_rss_growth_leaves_out_start_up() -> None:
    # a 5-step run: a tenth of its steps is 0, but a process that has not trained one step is
    # still importing its libraries (260 MiB -> 390 MiB is start-up, not growth)
    samples = {"label party": [(0, 260.0), (0, 390.0), (2, 392.0), (5, 393.0)],
               "passive party 1": [(0, 261.0), (0, 300.0)]}
    assert rss_growth(samples, 5) == {"label party": (392.0, 393.0)}
    # a long run: from a tenth of its steps on
    assert rss_growth({"p": [(0, 100.0), (50, 300.0), (100, 301.0), (999, 310.0)]}, 1000) == {
        "p": (301.0, 310.0)}


def test_report_says_when_no_process_was_sampled_in_training() -> None:
    out = io.StringIO()
    run = {"steps": 0, "error": "label party exited with code 2", "growth": {}}
    assert print_report(Console(file=out, width=200), None, run) == 1
    text = out.getvalue()
    assert "FAILED: label party exited with code 2" in text
    assert "no process was sampled after the run's first train step" in text
    assert "RSS " not in text.replace("RSS growth", "")
