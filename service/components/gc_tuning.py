"""Garbage-collector settings for casetrail's long-running processes.

CPython frees almost every object by reference counting; the cyclic collector runs
every time allocations outnumber deallocations by its first threshold (700 by
default), and each run walks the young objects and, more rarely, everything. A
worker with a thousand cases in flight keeps a large live heap, so with the
defaults the collector takes a large share of the worker's CPU and finds very
little garbage (measured with ``python -m bench.worker_alone``; the figures are in
docs/benchmarks.md, in the row on the garbage collector).

So each component, once it has imported and built what it keeps for its life,
moves those objects to the collector's permanent generation (``gc.freeze``: full
collections no longer walk them) and raises the first threshold. Garbage in
reference cycles still gets collected, a little later: at most the threshold's
worth of objects waits for it.
"""

from __future__ import annotations

import gc

from casetrail.config import GC_THRESHOLD

DEFAULT_THRESHOLD = GC_THRESHOLD


def tune(threshold: int = DEFAULT_THRESHOLD) -> None:
    """Freeze what exists now and collect young objects every ``threshold`` net
    allocations (0 leaves the interpreter's settings alone)."""
    if threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)
