"""The watchdog that ends a role stuck in its own step: when it fires, when it does not, and
that the process ends even when saying so fails."""

from __future__ import annotations

import io
import sys
import threading
import time

import pytest

from splitleak import watchdog
from splitleak.watchdog import Heartbeat, Stuck, Watchdog

LIMIT = 0.3  # s


def _spin(heartbeat: Heartbeat, seconds: float, beats: bool) -> None:
    """The step's thread: one beat held for `seconds`, or a new beat every few milliseconds."""
    end = time.monotonic() + seconds
    heartbeat.beat = object()
    while time.monotonic() < end:
        if beats:
            heartbeat.beat = object()
        time.sleep(0.005)


def _watch(heartbeat: Heartbeat, seconds: float, beats: bool,
           stuck: object = None) -> list[Stuck]:
    fired: list[Stuck] = []
    dog = Watchdog(heartbeat, LIMIT, stuck or fired.append, lambda: {}).start()
    try:
        _spin(heartbeat, seconds, beats)
    finally:
        dog.stop()
    return fired


def test_a_beat_held_past_the_limit_is_named_where_it_is() -> None:
    fired = _watch(Heartbeat(), 8 * LIMIT, beats=False)
    assert len(fired) == 1, fired
    assert fired[0].seconds > LIMIT and not fired[0].plugin
    assert "_spin() at tests/test_watchdog.py" in fired[0].where, fired[0].where


def test_steps_that_move_or_wait_are_never_stuck() -> None:
    heartbeat = Heartbeat()
    assert _watch(heartbeat, 6 * LIMIT, beats=True) == []
    heartbeat.beat = None  # waiting on a peer: its own deadline covers that
    dog = Watchdog(heartbeat, LIMIT, pytest.fail, lambda: {}).start()
    time.sleep(4 * LIMIT)
    dog.stop()


def test_it_fires_when_stderr_has_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """faulthandler raised on a stderr without a file descriptor: the watchdog's thread died
    there and the stuck process hung for ever."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert len(_watch(Heartbeat(), 8 * LIMIT, beats=False)) == 1


def test_the_process_ends_even_when_saying_why_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while writing outcome.json raised in the watchdog's thread, which died; the
    process, its step stuck, never ended."""
    ended = threading.Event()
    codes: list[int] = []

    def exit_now(code: int) -> None:
        codes.append(code)
        ended.set()

    def full_disk(stuck: Stuck) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(watchdog.os, "_exit", exit_now)
    _watch(Heartbeat(), 8 * LIMIT, beats=False, stuck=full_disk)
    assert ended.wait(5) and codes == [watchdog.EXIT_FAILED]
