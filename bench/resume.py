"""What taking up a case costs as its record grows: a worker that resumes a case reads
its earlier attempts' events, checks their chains and signatures and rebuilds the
conversation (``casetrail.audit.resume.record_so_far``, the worker's own code) before it asks
the model anything. Cases of 10, 50 and 200 cycles run through the pipeline to
completion first; then each is read back as the next attempt would read it.

    python -m bench.resume
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg

from bench.e2e import post_cases
from bench.harness import (
    Processes,
    api_key,
    bench_settings,
    namespace,
    percentiles,
    wait_ready,
    wait_rows,
)
from casetrail.adapters.store import CaseStore, KeyRegistry
from casetrail.adapters.store.pool import create_pool
from casetrail.audit.resume import record_so_far

PORT = 8791
SHAPES = ((10, 20), (50, 20), (200, 20))
"""(cycles a case, cases)."""


async def resume_costs(shapes: tuple[tuple[int, int], ...] = SHAPES) -> list[dict[str, Any]]:
    settings = bench_settings(api_port=PORT)
    async with namespace(settings) as pool:
        key = await api_key(pool)
        stack = Processes(settings)
        for name in ("api", "worker", "consumer"):
            stack.spawn(name, name, *(("--port", str(PORT)) if name == "api" else ()))
        try:
            await wait_ready(f"http://127.0.0.1:{PORT}")
            for cycles, cases in shapes:
                await post_cases(f"http://127.0.0.1:{PORT}", {
                    "agent": "throughput-probe", "input": {"cycles": cycles},
                    "limits": {"maxCycles": cycles, "deadlineSeconds": 600}}, cases, key,
                    concurrency=4)
            await wait_rows(pool, "SELECT count(*) FROM cases WHERE status = 'completed'",
                            sum(cases for _, cases in shapes))
        finally:
            stack.stop()
        # the worker's kind of pool (its JSON codecs), on the bench's connection
        reader = await create_pool(settings.database_url, max_size=2)
        store, keys = CaseStore(reader), KeyRegistry(reader)
        try:
            return await _read_back(pool, store, keys, shapes)
        finally:
            await reader.close()


async def _read_back(pool: asyncpg.Pool, store: CaseStore, keys: KeyRegistry,
                     shapes: tuple[tuple[int, int], ...]) -> list[dict[str, Any]]:
    """Each case read as its next attempt would read it, three times (the first warms
    Postgres); the medians of the last two."""
    rows = []
    for cycles, _ in shapes:
        ids: list[uuid.UUID] = [r["case_id"] for r in await pool.fetch(
            "SELECT case_id FROM cases WHERE (input->>'cycles')::int = $1", cycles)]
        walls, cpus = [], []
        for case_id in ids * 3:  # each case three times: the first read warms Postgres
            began, cpu = time.perf_counter(), time.process_time()
            found, _ = await record_so_far(store, keys, case_id, 2, {}, 600)
            walls.append((time.perf_counter() - began) * 1000)
            cpus.append((time.process_time() - cpu) * 1000)
            if found is None or found.cycles != cycles:
                raise RuntimeError(f"case {case_id} resumed from "
                                   f"{None if found is None else found.cycles} cycles, "
                                   f"not {cycles}")
        wall, cpu_ms = percentiles(walls[len(ids):]), percentiles(cpus[len(ids):])
        rows.append({"cycles": cycles, "cases": len(ids), "events": cycles + 2,
                     "wallP50Ms": round(wall["p50"], 2), "wallP99Ms": round(wall["p99"], 2),
                     "workerCpuP50Ms": round(cpu_ms["p50"], 2),
                     "workerCpuPerCycleUs": round(cpu_ms["p50"] * 1000 / cycles)})
    return rows


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    for row in asyncio.run(resume_costs()):
        print(row)
