"""Case starts over A2A against ``POST /cases``: the same cases accepted a second by the
same API, once through REST and once through A2A's ``SendMessage`` (JSON-RPC, the
official SDK's dispatcher, a messageId each), closed loop at ``concurrency``, in
alternating rounds. A start is accepted once its case row is committed and its start
command confirmed by the broker: what is measured is the API, RabbitMQ and Postgres
(no worker runs; the cases stay queued). Figures: accepted a second, latency
percentiles, the API's CPU a start; the ratio A2A / REST. Then ``GetTask`` polls of one
of those queued tasks, as a client that does not stream makes them: polls a second and
the API's CPU a poll.

Usage: python -m bench.a2a [cases] [concurrency] [rounds]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from bench.harness import (
    Processes,
    api_key,
    bench_settings,
    cpu_seconds,
    namespace,
    percentiles,
    wait_ready,
    wait_rows,
)
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS

PORT = 8798
APPLICATION = SAMPLE_APPLICATIONS[0]


def _rest(client: httpx.AsyncClient) -> Callable[[], Awaitable[None]]:
    async def one() -> None:
        reply = await client.post("/cases", json={"agent": "loan-officer",
                                                  "input": APPLICATION})
        if reply.status_code != 202:
            raise RuntimeError(f"POST /cases: {reply.status_code} {reply.text}")
    return one


def _a2a(client: httpx.AsyncClient) -> Callable[[], Awaitable[None]]:
    async def one() -> None:
        reply = await client.post("/a2a/loan-officer/", headers={"A2A-Version": "1.0"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
                "messageId": uuid.uuid4().hex, "role": "ROLE_USER",
                "parts": [{"data": APPLICATION}]}}})
        if reply.status_code != 200 or "error" in reply.json():
            raise RuntimeError(f"SendMessage: {reply.status_code} {reply.text}")
    return one


def _get(client: httpx.AsyncClient, task_id: str) -> Callable[[], Awaitable[None]]:
    async def one() -> None:
        reply = await client.post("/a2a/loan-officer/", headers={"A2A-Version": "1.0"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}})
        if reply.status_code != 200 or "error" in reply.json():
            raise RuntimeError(f"GetTask: {reply.status_code} {reply.text}")
    return one


async def _round(start: Callable[[], Awaitable[None]], cases: int, concurrency: int,
                 api_pid: int) -> dict[str, Any]:
    latencies: list[float] = []
    queue = iter(range(cases))

    async def lane() -> None:
        for _ in queue:
            began = time.perf_counter()
            await start()
            latencies.append((time.perf_counter() - began) * 1000)

    cpu = cpu_seconds(api_pid)
    began = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    seconds = time.perf_counter() - began
    return {"perSecond": round(cases / seconds, 1),
            "apiCpuUsPerStart": round((cpu_seconds(api_pid) - cpu) / cases * 1e6),
            **{f"{k}Ms": round(v, 1) for k, v in percentiles(latencies).items()}}


async def starts(cases: int = 2000, concurrency: int = 32, rounds: int = 2) -> dict[str, Any]:
    """Alternating REST and A2A rounds; the medians and the ratio (the ``make bench`` row)."""
    settings = bench_settings(api_port=PORT)
    async with namespace(settings) as pool:
        key = await api_key(pool)
        stack = Processes(settings)
        api = stack.spawn("api", "api", "--port", str(PORT))
        base = f"http://127.0.0.1:{PORT}"
        runs: dict[str, list[dict[str, Any]]] = {"rest": [], "a2a": []}
        try:
            await wait_ready(base)
            limits = httpx.Limits(max_connections=concurrency)
            async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits, headers={
                    "Authorization": f"Bearer {key}"}) as client:
                await _round(_a2a(client), 50, 8, api.pid)  # warm both paths
                await _round(_rest(client), 50, 8, api.pid)
                for _ in range(rounds):
                    runs["rest"].append(await _round(_rest(client), cases, concurrency,
                                                     api.pid))
                    runs["a2a"].append(await _round(_a2a(client), cases, concurrency,
                                                    api.pid))
                task = (await client.get("/cases", params={"limit": 1})).json()
                poll = _get(client, task["items"][0]["caseId"])
                polls = [await _round(poll, cases, concurrency, api.pid)
                         for _ in range(rounds)]
            await wait_rows(pool, "SELECT count(*) FROM cases", 100 + 2 * rounds * cases, 60)
        finally:
            stack.stop()
    rest, a2a = ({k: statistics.median(r[k] for r in runs[side]) for k in runs[side][0]}
                 for side in ("rest", "a2a"))
    get = {k: statistics.median(r[k] for r in polls) for k in polls[0]}
    return {"cases": cases, "concurrency": concurrency, "rounds": rounds, "rest": rest,
            "a2a": a2a, "ratio": round(a2a["perSecond"] / rest["perSecond"], 2),
            "getTask": {"pollsPerSecond": get["perSecond"],
                        "apiCpuUsPerPoll": get["apiCpuUsPerStart"], "p50Ms": get["p50Ms"]}}


if __name__ == "__main__":
    n, c, r = (int(a) for a in (sys.argv[1:] + ["2000", "32", "2"][len(sys.argv) - 1:])[:3])
    print(asyncio.run(starts(n, c, r)))
