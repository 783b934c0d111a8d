"""Replaying many decisions: ``casetrail replay --all`` over N recorded loan cases, then
``casetrail backtest`` over the same N (a worker runs the challenger, the agent as
installed with its scripted model, and keeps the signed record).

N loan applications are decided by the real stack (scripted model, worker tools on the
capability worker): the three samples (the referred one confirmed by a person), then
approvals and declines, and the command line replays them all. Every case is genuine:
a backtest scores only cases whose record verifies.

Usage: python -m bench.replay [cases]
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from typing import Any

import httpx
import orjson

from bench.e2e import post_cases
from bench.harness import (
    Processes,
    api_key,
    bench_settings,
    cpu_seconds,
    namespace,
    wait_ready,
    wait_rows,
)
from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.components.supervisor import component_command

PORT = 8798


async def replay_at_scale(cases: int) -> dict[str, Any]:
    settings = bench_settings(api_port=PORT)
    async with namespace(settings) as pool:
        key = await api_key(pool)
        _, reviewer = await ApiKeyStore(pool).create(
            "default", ("cases:review", "cases:read"), "bench reviewer", None, "bench-rita")
        stack = Processes(settings)
        stack.spawn("api", "api", "--port", str(PORT))
        stack.spawn("worker", "worker")
        stack.spawn("consumer", "consumer")
        stack.spawn("capability", "capability-worker")
        try:
            await wait_ready(f"http://127.0.0.1:{PORT}")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT}",
                                         headers={"Authorization": f"Bearer {key}"}) as http:
                for application in SAMPLE_APPLICATIONS[:3]:
                    (await http.post("/cases", json={"agent": "loan-officer",
                                                     "input": application})).raise_for_status()
                # The refer waits for a person: one confirms it (replay then covers a
                # reviewed case too, comparing the agent's own decision).
                await wait_rows(pool, "SELECT count(*) FROM cases WHERE parked_attempt "
                                "IS NOT NULL", 1, 60)
                waiting = await pool.fetchval("SELECT case_id FROM cases WHERE "
                                              "parked_attempt IS NOT NULL")
                (await http.post(f"/cases/{waiting}/review", headers={
                    "Authorization": f"Bearer {reviewer}"}, json={
                    "verdict": "confirm", "reason": "Bench reviewer."})).raise_for_status()
                await wait_rows(pool, "SELECT count(*) FROM event_log WHERE event_type = "
                                "'CASE_COMPLETED'", 3)
                # The rest decided by the stack too, approvals and declines alike: a
                # backtest scores only cases whose record verifies, so none is a copy.
                more = max(0, cases - 3)
                for application, count in ((SAMPLE_APPLICATIONS[0], (more + 1) // 2),
                                           (SAMPLE_APPLICATIONS[2], more // 2)):
                    if count:
                        await post_cases(f"http://127.0.0.1:{PORT}", {
                            "agent": "loan-officer", "input": application}, count, key)
            await wait_rows(pool, "SELECT count(*) FROM event_log WHERE event_type = "
                            "'CASE_COMPLETED'", max(cases, 3), 600)
        finally:
            stack.stop()
        recorded = await pool.fetchval("SELECT count(*) FROM cases WHERE status = 'completed'")
        events = await pool.fetchval("SELECT count(*) FROM event_log")
        started = time.perf_counter()
        done = await asyncio.to_thread(
            subprocess.run, component_command("replay", "--all", "--agent", "loan-officer"),
            env=settings.environment(), capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        summary = re.search(r"(\d+) cases replayed: (\d+) same, (\d+) diverged", done.stdout)
        if done.returncode != 0 or summary is None:
            raise RuntimeError(f"replay failed ({done.returncode}): {done.stdout[-500:]}"
                               f"{done.stderr[-2000:]}")
        replayed, same, diverged = (int(g) for g in summary.groups())
        if same != replayed:
            raise RuntimeError(f"only {same} of {replayed} cases replayed the same: "
                               f"{done.stdout[-1000:]}")
        backtest = await backtest_at_scale(settings, recorded)
    return {"cases": recorded, "events": events, "replayed": replayed, "same": same,
            "diverged": diverged, "seconds": round(seconds, 2),
            "casesPerSecond": round(replayed / seconds, 1), "backtest": backtest}


async def backtest_at_scale(settings: Any, cases: int) -> dict[str, Any]:
    """``casetrail backtest`` over every recorded case, run by a worker (the challenger is
    the agent itself with its scripted model: every decision the same), its results and
    signed record kept; the worker's CPU per case."""
    stack = Processes(settings)
    worker = stack.spawn("worker", "worker")
    try:
        await asyncio.sleep(3)  # the worker's start (its first catalog reads)
        before = cpu_seconds(worker.pid)
        started = time.perf_counter()
        done = await asyncio.to_thread(
            subprocess.run, component_command(
                "backtest", "--agent", "loan-officer", "--limit", str(cases),
                "--concurrency", "32", "--json"),
            env=settings.environment(), capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        cpu = cpu_seconds(worker.pid) - before
    finally:
        stack.stop()
    if done.returncode != 0:
        raise RuntimeError(f"backtest failed ({done.returncode}): {done.stdout[-500:]}"
                           f"{done.stderr[-2000:]}")
    found = orjson.loads(done.stdout)
    run = found["summary"]["cases"]
    if found["summary"]["changed"] or found["summary"]["unansweredCalls"]:
        raise RuntimeError(f"the same agent changed decisions: {found['summary']}")
    return {"cases": run, "seconds": round(seconds, 2), "runSeconds": found["seconds"],
            "casesPerSecond": round(run / seconds, 1),
            "workerCpuMsPerCase": round(cpu * 1000 / run, 2),
            "recorded": found["record"]["hash"][:16]}


if __name__ == "__main__":
    print(asyncio.run(replay_at_scale(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)))
