"""One sweep point in its own process: the run (distributed, or in process) and the attacker's
analysis, exactly as `splitleak run [--in-process]` does them; the outcome goes to
sweep_point.json in the run directory.

    python -m orchestration.sweep.worker RUN_DIR [--in-process | --analysis-only | --resume]

The engine stops a point with SIGTERM; the worker then stops every party it started.
A process of its own per point keeps matplotlib (not thread-safe) and the GIL out of the way
of the other points and makes stopping a point one signal.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

from orchestration.commands import analysable, analyse_run
from orchestration.run import RunFailed, RunOutcome, run_distributed
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.summary import read_training_summary
from splitleak.artifacts.sweep import PointResult, write_result
from splitleak.cli_common import EXIT_FAILED, EXIT_INTERRUPTED, end_process, setup_logging
from splitleak.config import load_config
from splitleak.lifeline import follow_parent

log = logging.getLogger("sweep")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """The first SIGTERM stops the point; the stop then runs to its end (the engine SIGKILLs a
    worker that overstays), and a repeat, e.g. the lifeline's as the sweep exits, is ignored."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _outcome_of_finished_run(run: RunDir) -> RunOutcome:
    """What an engine that trained the run elsewhere recorded in summary.json."""
    summary = read_training_summary(run)
    return RunOutcome(run, summary.mode, summary.seconds, summary.train_steps,
                      summary.final_eval, summary.training_seconds)


def run_point(run: RunDir, analysis_only: bool = False, in_process: bool = False,
              console: Console | None = None,
              on_record: Callable[[dict[str, Any]], None] | None = None,
              propagate_stop: bool = False, resume: bool = False) -> PointResult:
    """Train (unless `analysis_only`) and analyse the point in `run`; `in_process`: trained by
    the in-process reference, `on_record` seeing its metrics records as they are written.
    Ctrl-C (or the sweep's SIGTERM) gives an interrupted result, or with `propagate_stop`
    (the sweep's own process) goes on up to the sweep. `resume`: continue the distributed run
    from its newest complete checkpoint."""
    started = time.monotonic()
    cfg = load_config(run.config)
    try:
        if analysis_only:
            outcome = _outcome_of_finished_run(run)
        elif in_process:
            from orchestration.reference import train_in_process

            outcome = train_in_process(cfg, run, on_record)
        else:
            outcome = run_distributed(cfg, run, resume=resume)
        if analysable(cfg):
            analyse_run(outcome, console or Console(file=sys.stdout, width=120))
    except RunFailed as err:
        return PointResult("failed", time.monotonic() - started, str(err))
    except KeyboardInterrupt:
        if propagate_stop:
            raise
        return PointResult("interrupted", time.monotonic() - started, "stopped by the sweep")
    except Exception as err:  # noqa: BLE001 - the sweep records why and goes on with other points
        log.exception("point failed")
        return PointResult("failed", time.monotonic() - started, f"{type(err).__name__}: {err}")
    return PointResult("done", time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestration.sweep.worker", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="the point's run directory (holds config.toml)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--in-process", action="store_true",
                      help="train with the in-process reference (no party processes)")
    mode.add_argument("--analysis-only", action="store_true",
                      help="the run was trained elsewhere (summary.json written): analyse it")
    mode.add_argument("--resume", action="store_true",
                      help="continue the distributed run from its newest complete checkpoint")
    args = parser.parse_args(argv)
    setup_logging("sweep-point")
    signal.signal(signal.SIGTERM, _interrupt)
    result = run_point(RunDir(args.run_dir), args.analysis_only, args.in_process,
                       resume=args.resume)
    # The point is over: a SIGTERM now (a stop racing its end) would only put a traceback in
    # its log from an atexit handler (the engine SIGKILLs a worker that does not end).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write_result(args.run_dir, result)
    if result.status == "failed":
        log.error("%s", result.message)
    return {"done": 0, "failed": EXIT_FAILED}.get(result.status, EXIT_INTERRUPTED)


if __name__ == "__main__":
    follow_parent()
    end_process(main)
