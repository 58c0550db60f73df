"""A role stuck in its own step (a plug-in that never returns) is named and ended: a watchdog
thread reads where the step's thread is once its heartbeat stops for the step deadline."""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from splitleak.cli_common import EXIT_BAD_INPUT, EXIT_FAILED
from splitleak.provenance import BUILT_IN_PACKAGES, own_plugin

log = logging.getLogger("splitleak.watchdog")

# Past topology.step_deadline_s, a step's own compute gets this long before it counts as stuck.
STUCK_GRACE = 2.0
# A tick that ends this much later than asked means this process itself was not running
# (SIGSTOP, a swapped-out VM): that time is not counted against the step.
STALL_TOLERANCE = 2.0


class Heartbeat:
    """What the step's thread is working on: the hot path assigns `beat` (the batch in hand, a
    new object each step), and None while it waits for a peer (its own deadline covers that)."""

    __slots__ = ("beat",)

    def __init__(self) -> None:
        self.beat: object | None = None


@dataclass(frozen=True)
class Stuck:
    """Where a stuck step is: `beat` (what it was working on), how long, and the sentence
    naming the plug-in (or the code) and the function and file:line it is in."""

    beat: object
    seconds: float
    where: str
    plugin: bool  # in a plug-in of one's own: fixing the plug-in is what to do


def suspects(plugins: Iterable[tuple[str, str, Any]]) -> dict[str, str]:
    """{top-level package: its description} of each plug-in of one's own among (kind, name,
    entry): where a stuck frame lies in one of these packages, that plug-in is named."""
    found: dict[str, str] = {}
    for kind, name, entry in plugins:
        origin = own_plugin(kind, name, entry)
        package = str(getattr(entry, "__module__", "")).split(".")[0]
        if origin is not None and package:
            found.setdefault(package, origin)
    return found


def where_stuck(thread_id: int, plugins: dict[str, str]) -> tuple[str, bool]:
    """`defense 'hang' (…), in apply() at hangdef/__init__.py:12` when the thread's innermost
    frame of a package in `plugins` is there (and True); else its innermost frame of this
    project's own code (or its innermost at all)."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return "a thread that has ended", False
    stack: list[tuple[str, FrameType]] = []  # innermost first, with its top-level package
    while frame is not None:
        stack.append((str(frame.f_globals.get("__name__", "")).split(".")[0], frame))
        frame = frame.f_back
    for package, f in stack:
        if package in plugins:
            return f"{plugins[package]}, in {_at(f)}", True
    own = [f for package, f in stack if package in BUILT_IN_PACKAGES]
    return f"its own code, in {_at((own or [f for _, f in stack])[0])}", False


def _at(frame: FrameType) -> str:
    parts = Path(frame.f_code.co_filename).parts
    short = str(Path(*parts[-2:])) if len(parts) >= 2 else frame.f_code.co_filename
    return f"{frame.f_code.co_name}() at {short}:{frame.f_lineno}"


class Watchdog:
    """Watches `heartbeat` from a daemon thread: when it holds the same beat for `limit`
    seconds (time this process was stopped not counted), calls `stuck` with a Stuck, in the
    watchdog's thread (the step's thread is the one that is stuck), after dumping every
    thread's stack to stderr (the role's log)."""

    def __init__(self, heartbeat: Heartbeat, limit: float, stuck: Callable[[Stuck], object],
                 plugins: Callable[[], dict[str, str]]) -> None:
        self.heartbeat = heartbeat
        self.limit = limit
        self.stuck = stuck
        self.plugins = plugins  # read only once stuck: the plug-ins may be built after start
        self.tick = min(0.25, limit / 10)
        self._thread_id = threading.get_ident()  # the step's thread: the one that starts this
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        seen: object | None = None
        since = time.monotonic()
        while True:
            before = time.monotonic()
            if self._stop.wait(self.tick):
                return
            now = time.monotonic()
            stalled = now - before - self.tick
            if stalled > STALL_TOLERANCE:
                since += stalled
            beat = self.heartbeat.beat
            if beat is None or beat is not seen:
                seen, since = beat, now
            elif now - since > self.limit:
                self._fire(beat, now - since)
                return

    def _fire(self, beat: object, seconds: float) -> None:
        """Every thread's stack to stderr (the role's log), then `stuck`; should anything on
        the way raise (a full disk, say), the process ends all the same: its stuck thread never
        returns."""
        log.error("the step has not moved for %.1f s; every thread's stack:", seconds)
        try:
            faulthandler.dump_traceback(all_threads=True)
        except (OSError, ValueError, AttributeError, RuntimeError):  # stderr has no file
            log.error("(no stack: stderr has no file descriptor)")
        try:
            self.stuck(Stuck(beat, seconds, *where_stuck(self._thread_id, self.plugins())))
        except BaseException:  # noqa: BLE001 - the process must end, whatever went wrong
            log.exception("ending the stuck process failed; it ends now")
            logging.shutdown()
            os._exit(EXIT_FAILED)


def stuck_sentence(role: str, doing: str, stuck: Stuck, limit: str, then: str) -> str:
    """`the label party is stuck at TRAIN step 5: defense 'hang' (…), in apply() at …:12, has not
    returned for 5.1 s (<limit>); fix the plug-in, then <then>`."""
    fix = "fix the plug-in" if stuck.plugin else "its log holds every thread's stack"
    return (f"{role} is stuck {doing}: {stuck.where}, has not returned for {stuck.seconds:.1f} s "
            f"({limit}); {fix}, then {then}")


def resume_hint(run_root: Path, checkpoint_step: int | None) -> str:
    resume = (f"continues from the checkpoint of step {checkpoint_step}"
              if checkpoint_step is not None else "starts it again from step 0")
    return f"`splitleak run --resume {run_root}` {resume}"


def step_limit(deadline: float) -> str:
    """What a stuck step's limit is, in words."""
    return f"topology.step_deadline_s = {deadline:g} s, plus {STUCK_GRACE:g} s grace"


def end_stuck(logger: logging.Logger | None, sentence: str, plugin: bool) -> NoReturn:
    """Log `sentence` (unless `logger` is None: said otherwise) and end this process at once
    (its stuck thread never returns, so nothing else would): exit 2 when stuck in a plug-in of
    one's own (as for one that raises), else 1."""
    if logger is not None:
        logger.error("%s", sentence)
    logging.shutdown()
    os._exit(EXIT_BAD_INPUT if plugin else EXIT_FAILED)


@contextmanager
def watching(heartbeat: Heartbeat, limit: float, stuck: Callable[[Stuck], object],
             plugins: Callable[[], dict[str, str]]) -> Iterator[None]:
    """The block, its `heartbeat` watched by a Watchdog (Watchdog's arguments)."""
    watchdog = Watchdog(heartbeat, limit, stuck, plugins).start()
    try:
        yield
    finally:
        watchdog.stop()


def watched(limit: float, stuck: Callable[[Stuck], object],
            plugins: dict[str, str]) -> AbstractContextManager[None]:
    """The block, timed by a Watchdog as one step of `limit` seconds (a one-off: a protection)."""
    heartbeat = Heartbeat()
    heartbeat.beat = plugins  # any object: the block is one beat
    return watching(heartbeat, limit, stuck, lambda: plugins)
