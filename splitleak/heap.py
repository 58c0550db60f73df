"""Start-up's objects out of the garbage collector's way once a step loop begins."""

from __future__ import annotations

import gc

_frozen = False


def freeze_start_up() -> None:
    """Move every object alive now (the imports, the data, the model, gRPC's state) to the
    collector's permanent generation, which no collection scans: without it, the full
    collection that falls due during training walks the whole start-up heap (torch alone is
    hundreds of thousands of objects), a pause of 0.6-1.0 s in one step on 2 cores. Objects
    made later are collected as before, and the frozen ones are freed as usual once nothing
    refers to them (only a reference cycle among them stays). Once per process: a process
    that runs several loops (the in-process sweep engine, the bench) freezes its imports with
    the first, not every finished run's leftovers with the next."""
    global _frozen
    if not _frozen:
        gc.freeze()
        _frozen = True
