"""Cases waiting for people: 10,000 parked cases cost the worker nothing it holds (its
memory against the same worker idle, no unacked message), and a review reaches the
stored terminal event quickly (from the POST to the consumer's commit).

Usage: python -m bench.review [parked cases] [reviews]
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import asyncpg
import httpx

from bench.e2e import post_cases
from bench.harness import (
    Processes,
    api_key,
    bench_settings,
    namespace,
    peak_rss_mb,
    percentiles,
    unacked,
    wait_ready,
    wait_rows,
)
from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings

PORT = 8794
REFERRED = SAMPLE_APPLICATIONS[1]  # the scripted loan officer refers it: it waits


async def parked_and_reviewed(settings: Settings, cases: int = 10_000, reviews: int = 1000,
                              rate: float = 50.0) -> dict[str, Any]:
    """``cases`` referred loan cases park; then ``reviews`` of them are confirmed at
    ``rate`` a second (open loop: each at its time, however long the others take), each
    timed from its POST to its terminal event stored."""
    async with namespace(settings) as pool:
        key = await api_key(pool)
        _, reviewer = await ApiKeyStore(pool).create(
            "default", ("cases:review", "cases:read"), "bench reviewer", None, "bench-rita")
        stack = Processes(settings)
        stack.spawn("api", "api", "--port", str(settings.api_port))
        worker = stack.spawn("worker", "worker")
        stack.spawn("consumer", "consumer")
        stack.spawn("ledger", "ledger")
        stack.spawn("capability-worker", "capability-worker")  # the loan officer's bureau
        base = f"http://127.0.0.1:{settings.api_port}"
        try:
            await wait_ready(base)
            await asyncio.sleep(3.0)  # settled: pools open, imports done
            idle = peak_rss_mb(worker.pid, "VmRSS")
            started = time.time()
            await post_cases(base, {"agent": "loan-officer", "input": REFERRED}, cases, key)
            await wait_rows(pool, "SELECT count(*) FROM cases WHERE parked_attempt IS NOT NULL",
                            cases, 600)
            parked_seconds = time.time() - started
            await asyncio.sleep(3.0)
            waiting = peak_rss_mb(worker.pid, "VmRSS")
            held = await asyncio.to_thread(unacked, settings.namespace)
            latencies = await _review(pool, base, reviewer, reviews, rate)
        finally:
            stack.stop()
    figures = percentiles([s * 1000 for s in latencies])
    return {
        "parkedCases": cases, "parkSeconds": round(parked_seconds, 1),
        "workerIdleRssMb": round(idle, 1), "workerRssParkedMb": round(waiting, 1),
        "rssGrowthMb": round(waiting - idle, 1), "unackedWhileParked": held,
        "reviews": reviews, "reviewsPerSecond": rate,
        **{f"reviewToTerminal{k.capitalize()}Ms": round(v, 1) for k, v in figures.items()},
    }


async def _review(pool: asyncpg.Pool, base: str, reviewer: str, count: int,
                  rate: float) -> list[float]:
    """Confirm ``count`` waiting cases, ``rate`` a second; for each, seconds from the
    POST to its terminal event stored (``recorded_at``, the consumer's commit)."""
    rows = await pool.fetch("SELECT case_id FROM cases WHERE parked_attempt IS NOT NULL "
                            "ORDER BY parked_at LIMIT $1", count)
    sent: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=base, timeout=30, headers={
            "Authorization": f"Bearer {reviewer}"}) as client:
        async def one(case_id: str, at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            sent[case_id] = time.time()
            reply = await client.post(f"/cases/{case_id}/review", json={
                "verdict": "confirm", "reason": "Income verified by phone."})
            if reply.status_code != 202:
                raise RuntimeError(f"review of {case_id}: {reply.status_code} {reply.text}")

        start = time.monotonic()
        await asyncio.gather(*(one(str(row["case_id"]), start + i / rate)
                               for i, row in enumerate(rows)))
    await wait_rows(pool, "SELECT count(*) FROM event_log WHERE event_type = 'CASE_COMPLETED'",
                    len(sent), 300)
    stored = await pool.fetch(
        "SELECT case_id::text, extract(epoch FROM recorded_at) AS at FROM event_log "
        "WHERE event_type = 'CASE_COMPLETED'")
    return [float(r["at"]) - sent[r["case_id"]] for r in stored if r["case_id"] in sent]


if __name__ == "__main__":
    parked, reviewed = (int(a) for a in (sys.argv[1:] + ["10000", "1000"][len(sys.argv) - 1:]))
    print(asyncio.run(parked_and_reviewed(bench_settings(api_port=PORT), parked, reviewed)))
