"""What the worker's trail keeps after attempts that stop without a terminal event: parked
for a person, or handed back to the queue (a deadline for its slot, a shutdown). Each
emits its start and a cycle through the worker's own emitter, whose output is dropped
here (this measures what the emitter holds, not the bus), then stops.
``python -m bench.trail_heads [ATTEMPTS]``: ATTEMPTS parked and as many handed back."""

from __future__ import annotations

import asyncio
import gc
import sys
import tracemalloc
from typing import Any

from bench.raw import sample_cycles
from casetrail.contract.events import Event, new_case_id
from casetrail.contract.integrity import Integrity, Signer
from casetrail.trail.emitter import TrailEmitter


class _Dropped:
    async def publish_sealed(self, event: Event, body: bytes, integrity: Integrity) -> None:
        return None


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def _attempts(trail: TrailEmitter, count: int, crash: bool) -> None:
    for _ in range(count):
        case_id = new_case_id()
        try:
            with trail.attempt(case_id, 1):
                for event in sample_cycles(2, case_id):
                    await trail.emit(event)
                if crash:
                    raise asyncio.CancelledError  # how a handed-back attempt stops
        except asyncio.CancelledError:
            pass


async def retained(count: int = 10_000) -> dict[str, Any]:
    """Heap and RSS growth over ``count`` parked and ``count`` handed-back attempts, after
    a warm-up round of the same size (so imports and caches are not counted)."""
    trail = TrailEmitter(_Dropped(), Signer.generate())
    await _attempts(trail, count, crash=False)
    gc.collect()
    rss_before = _rss_kib()
    tracemalloc.start()
    heap_before = tracemalloc.get_traced_memory()[0]
    await _attempts(trail, count, crash=False)
    await _attempts(trail, count, crash=True)
    gc.collect()
    heap_after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"attempts": 2 * count, "openChains": trail.open_chains,
            "heapGrowthKiB": round((heap_after - heap_before) / 1024, 1),
            "rssGrowthKiB": _rss_kib() - rss_before}


if __name__ == "__main__":
    print(asyncio.run(retained(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)))
