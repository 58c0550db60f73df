"""The analysis's batch attacks in J worker processes, their rows handed on in the order one
process would make them, with at most 2·J chunks of batches in flight (memory stays bounded).

Workers start from a forkserver that has imported the analysis once: the parent may hold
torch's or OpenBLAS's threads, which a plain fork would copy in a state they cannot use, and
spawn would import the analysis again in every worker. Each worker gets the per-attacker
context (its built attacks, its seed) once, at start, and per chunk only the batches' slices
(gradients, labels, anchors). It ignores Ctrl-C from its start (the parent stops the pool within
STOP_S: no half-run chunk is lost or reported twice), uses one BLAS thread (J workers, J cores),
and dies with its forkserver, which dies with the parent: no worker outlives the analysis."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from threadpoolctl import threadpool_limits

from splitleak.stopping import stops_noted

Item = Any
Result = TypeVar("Result")
Given = TypeVar("Given", contravariant=True)  # what a Batches takes (Protocol variance)
CHUNK_BATCHES = 8  # logged batches a chunk (~0.1 s of work): each chunk is one round trip
IN_FLIGHT = 2  # chunks per worker sent and not yet handed on
SERIAL_BELOW = 400  # logged batches: a shorter log is analysed in the parent (the forkserver's
# imports take ~2 s before the first worker starts: one more core makes that up after ~400
# batches of ~10 ms)
# What the forkserver imports once for every worker: the analysis, and what the clustering
# attack imports on first use (scikit-learn: ~1 s of a worker's start, each)
PRELOAD = ["attacker.analysis.analyze", "sklearn.cluster", "sklearn.metrics", "scipy.optimize"]
_PR_SET_PDEATHSIG = 1
STOP_S = 10.0  # s: what the running chunks may take to end at Ctrl-C before their workers are killed

_work: Callable[[Any, Item], Any] | None = None
_context: Any = None


class WorkerLost(RuntimeError):
    """A worker process ended without an answer (killed, out of memory)."""


class Batches(Protocol[Given]):
    """Where the analysis puts each batch's rows in order: `add` for rows it made itself, `submit`
    for an item `work` turns into rows, `end_batch` after each logged batch."""

    def add(self, rows: Given) -> None: ...

    def submit(self, item: Item) -> None: ...

    def end_batch(self) -> None: ...


class InOrder(Generic[Result]):
    """J = 1: each item worked on at once, in this process; rows go straight to `emit`."""

    def __init__(self, work: Callable[[Any, Item], Result], context: Any,
                 emit: Callable[[Result], None]) -> None:
        self.work, self.context, self.emit = work, context, emit

    def add(self, rows: Result) -> None:
        self.emit(rows)

    def submit(self, item: Item) -> None:
        self.emit(self.work(self.context, item))

    def end_batch(self) -> None:
        pass


@dataclass(eq=False)
class _Chunk:
    items: list[Item]
    future: Future | None = None
    size: int = 0


class WorkerPool(Generic[Result]):
    """J > 1: items worked on in J processes, a chunk of CHUNK_BATCHES batches at a time; rows
    (theirs, and the parent's own `add`s between them) reach `emit` in submission order.

    Used as a context manager. On leaving it normally every chunk is awaited and handed on. On
    an error in the parent, the chunks before it are still awaited (not handed on): an error
    one of them raised is the one raised, as one process would have met it first. Ctrl-C
    cancels the chunks not started and waits only for the J running ones."""

    def __init__(self, jobs: int, work: Callable[[Any, Item], Result], context: Any,
                 emit: Callable[[Result], None]) -> None:
        self.jobs, self.emit = jobs, emit
        self._executor = ProcessPoolExecutor(jobs, mp_context=_forkserver(),
                                             initializer=_start_worker, initargs=(work, context))
        self._entries: deque[tuple[_Chunk | None, Any]] = deque()  # (chunk, index) or (None, rows)
        self._chunk = _Chunk([])
        self._batches = 0  # in the chunk being filled
        self._in_flight = 0  # chunks sent whose rows are not all handed on

    def add(self, rows: Result) -> None:
        if self._entries:
            self._entries.append((None, rows))
        else:
            self.emit(rows)

    def submit(self, item: Item) -> None:
        self._entries.append((self._chunk, len(self._chunk.items)))
        self._chunk.items.append(item)

    def end_batch(self) -> None:
        self._batches += 1
        if self._batches == CHUNK_BATCHES:
            self._send()
            self._hand_on(IN_FLIGHT * self.jobs)

    def _send(self) -> None:
        chunk = self._chunk
        if chunk.items:
            chunk.size = len(chunk.items)
            with _ctrl_c_held():  # a worker may be starting
                chunk.future = self._executor.submit(_work_on, chunk.items)
            chunk.items = []  # the worker has them now; the parent keeps no copy
            self._in_flight += 1
        self._chunk, self._batches = _Chunk([]), 0

    def _hand_on(self, keep: int, emit: bool = True) -> None:
        """Hand rows on, in order, until at most `keep` chunks are in flight."""
        while self._entries and self._in_flight > keep:
            chunk, entry = self._entries.popleft()
            if chunk is None:
                if emit:
                    self.emit(entry)
                continue
            assert chunk.future is not None  # sent: in flight
            try:
                rows = chunk.future.result()[entry]  # a worker's error is raised here
            except BrokenProcessPool as err:
                raise WorkerLost(f"a worker process of the batch attacks ended abruptly (killed, "
                                 f"or out of memory?): {err} (--jobs 1: no worker "
                                 "processes)") from None
            if emit:
                self.emit(rows)
            if entry == chunk.size - 1:
                self._in_flight -= 1

    def __enter__(self) -> WorkerPool[Result]:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        interrupted = kind is not None and not issubclass(kind, Exception)
        try:
            if not interrupted:
                self._send()
                self._hand_on(0, emit=kind is None)  # raises an earlier batch's error first
                for _, rows in self._entries:  # the parent's own rows after the last chunk
                    if kind is None:
                        self.emit(rows)
                self._entries.clear()
        finally:
            self._shut_down(interrupted)

    def _shut_down(self, interrupted: bool) -> None:
        """End the workers: after their chunks, or at Ctrl-C after at most STOP_S of the running
        ones (a worker that does not end by then is killed: the analysis never hangs on one)."""
        if not interrupted:
            self._executor.shutdown(wait=True, cancel_futures=True)
            return
        workers = list((self._executor._processes or {}).values())  # noqa: SLF001 - no public list
        self._executor.shutdown(wait=False, cancel_futures=True)
        end = time.monotonic() + STOP_S
        for worker in workers:
            worker.join(max(0.0, end - time.monotonic()))
            if worker.is_alive():
                worker.kill()
                worker.join()


def batches(jobs: int, logged: int, work: Callable[[Any, Item], Result], context: Any,
            emit: Callable[[Result], None]) -> contextlib.AbstractContextManager[Batches[Result]]:
    """Where `logged` batches' rows go: J worker processes, or this one for J = 1 or a log
    shorter than SERIAL_BELOW batches."""
    if jobs > 1 and logged >= SERIAL_BELOW:
        return WorkerPool(jobs, work, context, emit)
    return contextlib.nullcontext(InOrder(work, context, emit))


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM (which attacker analyze stops on alike) held off until the block ends
    (a submit, which may start a worker), then raised: a worker whose start is cut off is never
    waited for, and once the analysis is gone it cannot read what it was sent (the pool's
    semaphores are unlinked) and prints a traceback."""
    with stops_noted() as stop:
        yield
    if stop.signum is not None:
        raise stop.error()


def _forkserver() -> multiprocessing.context.ForkServerContext:
    """The forkserver context, its server started (once a process) with SIGINT ignored: it and
    every worker it forks keep ignoring it from their first instruction (an ignored signal stays
    ignored across fork and exec, and Python then installs no KeyboardInterrupt handler), so a
    terminal's Ctrl-C reaches only the analysis, which stops them. Before, a worker forked just
    then died in its start-up with a traceback, or half-started, and the analysis waited on it."""
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(PRELOAD)
    if threading.current_thread() is not threading.main_thread():  # no handler to swap here
        multiprocessing.forkserver.ensure_running()
        return forkserver
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, handler)
    return forkserver


def _start_worker(work: Callable[[Any, Item], Any], context: Any) -> None:
    global _work, _context
    _work, _context = work, context
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threadpool_limits(1)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    if sys.platform == "linux":  # its parent is the forkserver, which ends with the analysis
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _work_on(items: list[Item]) -> list[Any]:
    assert _work is not None  # set by _start_worker
    return [_work(_context, item) for item in items]
