"""What reading costs: one case read (``GET /cases/{id}``), case search at 1,000,000
cases, and 500 open event streams beside ``POST /cases``.

``python -m bench.viewer reads [REQUESTS]`` / ``python -m bench.viewer search [CASES]`` /
``python -m bench.viewer streams [STREAMS]``
(``python -m bench.viewer post BASE KEY RATE SECONDS`` is the POST load generator the
streams scenario runs in a process of its own).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import httpx
import orjson

from bench.harness import (
    Processes,
    api_key,
    bench_settings,
    namespace,
    peak_rss_mb,
    percentiles,
    wait_ready,
)
from casetrail.config import Settings

SEED_SQL = """
WITH made AS (
INSERT INTO cases (case_id, tenant_id, agent, status, input, model, limits, request_digest,
                   created_at, ended_at, cycles, input_tokens, output_tokens, answer,
                   attempts_claimed, started_by, outcome)
SELECT t.id, t.tenant, t.agent, t.status,
       CASE t.agent WHEN 'aml-screening' THEN '{"customerId": "[pii:customerId]"}'::jsonb
                    WHEN 'loan-officer' THEN jsonb_build_object(
                        'applicantId', 'A-' || (abs(hashtext(t.id::text)) % 200000))
                    ELSE '{}' END,
       '{}', '{}', 'seeded',
       t.created, t.created + interval '3 seconds', 4, 2400, 300,
       CASE WHEN t.status = 'completed' THEN jsonb_build_object('decision', t.decision) END,
       1, 'key:seeded',
       CASE WHEN t.status = 'failed' AND t.n % 2 = 0
            THEN '{"checks": [{"name": "names-the-applicant", "passed": false}]}'::jsonb END
FROM (
  SELECT gen_random_uuid() AS id,
         CASE WHEN r1 < 0.9 THEN 'default' ELSE 'other-' || (n % 20) END AS tenant,
         CASE WHEN r2 < 0.6 THEN 'loan-officer' WHEN r2 < 0.9 THEN 'aml-screening'
              ELSE 'throughput-probe' END AS agent,
         CASE WHEN r3 < 0.85 THEN 'completed' WHEN r3 < 0.90 THEN 'failed'
              WHEN r3 < 0.93 THEN 'cancelled' WHEN r3 < 0.95 THEN 'timed_out'
              WHEN r3 < 0.98 THEN 'running' ELSE 'queued' END AS status,
         CASE WHEN r2 < 0.6 THEN (ARRAY['approve','approve','refer','decline'])[1 + (n % 4)]
              WHEN r2 < 0.9 THEN (ARRAY['clear','clear','escalate','file-sar'])[1 + (n % 4)]
              ELSE 'done' END AS decision,
         now() - (r4 * interval '90 days') AS created, n
  FROM (SELECT n, random() AS r1, random() AS r2, random() AS r3, random() AS r4
        FROM generate_series($1::int, $2::int) AS n) AS g
) AS t
RETURNING case_id, tenant_id, agent, input, created_at)
INSERT INTO case_keys (case_id, tenant_id, field, value, digest, created_at)
SELECT case_id, tenant_id,
       CASE agent WHEN 'aml-screening' THEN 'customerId' ELSE 'applicantId' END,
       CASE agent WHEN 'aml-screening' THEN 'hmac:' || md5(case_id::text)
            ELSE input ->> 'applicantId' END,
       agent = 'aml-screening', created_at
FROM made WHERE agent <> 'throughput-probe'
"""
"""Cases over 90 days: 90 % of them the searching tenant's, three agents, realistic
status and decision mixes, a failed check on half the failed ones (rows only: search
reads no events); each loan case's applicant id (some 200,000 applicants, a few cases
each) and each AML case's customer id as a digest, kept as the API keeps them: with
the case, in the same statement (a key names only the case made with it)."""


def _shapes(now: datetime) -> dict[str, Any]:
    """Query shapes a reviewer uses; each is a function giving one request's params."""
    def window() -> dict[str, str]:
        start = now - timedelta(days=random.uniform(1, 89))
        return {"since": start.isoformat(), "until": (start + timedelta(days=1)).isoformat()}

    return {
        "newest": lambda: {},
        "agent": lambda: {"agent": random.choice(["loan-officer", "aml-screening"])},
        "status (rare: failed)": lambda: {"status": "failed"},
        "status (running)": lambda: {"status": "running"},
        "decision": lambda: {"decision": random.choice(["approve", "decline", "escalate"])},
        "agent + status": lambda: {"agent": "loan-officer", "status": "completed"},
        "agent + decision": lambda: {"agent": "loan-officer", "decision": "decline"},
        "agent + decision, no match": lambda: {"agent": "aml-screening",
                                               "decision": "decline"},
        "business key": lambda: {"key": f"A-{random.randrange(200_000)}"},
        "business key, by field": lambda: {"key.applicantId":
                                           f"A-{random.randrange(200_000)}"},
        "checks failed": lambda: {"checks": "failed"},
        "one day": window,
        "agent + one day": lambda: {"agent": "aml-screening", **window()},
    }


async def _seed(pool: asyncpg.Pool, cases: int) -> float:
    started = time.perf_counter()
    step = 100_000
    for first in range(1, cases + 1, step):
        await pool.execute(SEED_SQL, first, min(first + step - 1, cases))
    await pool.execute("ANALYZE cases")
    await pool.execute("ANALYZE case_keys")
    return time.perf_counter() - started


async def search_at_scale(settings: Settings, cases: int = 1_000_000, requests: int = 200
                          ) -> dict[str, Any]:
    """p50/p99 of ``GET /cases`` pages (50 items) per query shape, over real HTTP, one
    request at a time, against ``cases`` seeded rows; plus paging 20 pages deep."""
    async with namespace(settings) as pool:
        seeded = await _seed(pool, cases)
        key = await api_key(pool)
        stack = Processes(settings)
        stack.spawn("api", "api", "--port", str(settings.api_port))
        base = f"http://127.0.0.1:{settings.api_port}"
        shapes: dict[str, Any] = {}
        try:
            await wait_ready(base)
            async with httpx.AsyncClient(base_url=base, timeout=30,
                                         headers={"Authorization": f"Bearer {key}"}) as http:
                for name, params in _shapes(datetime.now(UTC)).items():
                    times, found = [], 0
                    for _ in range(requests):
                        started = time.perf_counter()
                        reply = await http.get("/cases", params={"limit": 50, **params()})
                        times.append((time.perf_counter() - started) * 1000)
                        reply.raise_for_status()
                        found += len(reply.json()["items"])
                    shapes[name] = {**percentiles(times), "itemsPerPage": found / requests}
                deep, cursor = [], None
                for _ in range(20):
                    started = time.perf_counter()
                    reply = await http.get("/cases", params={
                        "limit": 50, "agent": "loan-officer",
                        **({"cursor": cursor} if cursor else {})})
                    deep.append((time.perf_counter() - started) * 1000)
                    cursor = reply.json()["nextCursor"]
                shapes["agent, pages 1-20 by cursor"] = {**percentiles(deep),
                                                         "itemsPerPage": 50}
        finally:
            stack.stop()
    worst = max(shapes.items(), key=lambda item: item[1]["p99"])
    return {"cases": cases, "seedSeconds": round(seeded, 1), "requestsPerShape": requests,
            "shapes": shapes, "worstShape": worst[0], "worstP99Ms": worst[1]["p99"]}


async def _hold_stream(http: aiohttp.ClientSession, path: str, received: list[int],
                       opened: asyncio.Event, stop: asyncio.Event) -> None:
    async with http.get(path, headers={"Accept": "text/event-stream"}) as reply:
        reply.raise_for_status()
        opened.set()
        async for line in reply.content:
            if line.startswith(b"id:"):
                received[0] += 1
            if stop.is_set():
                return


def _client(base: str, key: str, connections: int, timeout: float) -> aiohttp.ClientSession:
    """The bench's HTTP client: aiohttp, whose requests cost a fraction of httpx's CPU, so
    that on two cores the client's own time does not read as the API's latency."""
    return aiohttp.ClientSession(
        base_url=base, headers={"Authorization": f"Bearer {key}"},
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=timeout))


async def post_at_rate(base: str, key: str, rate: float, seconds: float) -> dict[str, Any]:
    """Open loop: a ``POST /cases`` every ``1/rate`` s whatever the answers do, so a slow
    answer shows as latency, not as fewer requests. Its own CPU is reported with it."""
    body = orjson.dumps({"agent": "throughput-probe", "input": {"cycles": 1}})
    times: list[float] = []

    async def one(http: aiohttp.ClientSession) -> None:
        started = time.perf_counter()
        # Idempotent, so a request sent on a keep-alive connection the server was just
        # closing can be sent again without starting a second case.
        headers = {"Idempotency-Key": uuid.uuid4().hex, "Content-Type": "application/json"}
        for last_try in (False, True):
            try:
                async with http.post("/cases", data=body, headers=headers) as reply:
                    await reply.read()
                    reply.raise_for_status()
                break
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if last_try:
                    raise
        times.append((time.perf_counter() - started) * 1000)

    cpu_before = time.process_time()
    async with _client(base, key, 200, 30) as http:
        tasks, begun = [], time.perf_counter()
        for n in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, begun + n / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(one(http)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - begun
    return {"rate": rate, "requests": len(times),
            **{f"{k}Ms": round(v, 1) for k, v in percentiles(times).items()},
            "clientCores": round((time.process_time() - cpu_before) / elapsed, 2)}


async def _posts_from_another_process(base: str, key: str, rate: float, seconds: float
                                      ) -> dict[str, Any]:
    """``post_at_rate`` in a process of its own, so the stream readers here do not
    delay its requests (a client's lateness would read as the API's)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.viewer", "post", base, key, str(rate), str(seconds),
        stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the POST load generator failed ({child.returncode})")
    figures: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
    return figures


async def _with_cores(stack: Processes, phase: Awaitable[dict[str, Any]]
                      ) -> tuple[dict[str, Any], dict[str, float]]:
    """``phase``'s figures, and the cores each process was busy with meanwhile (the
    stream readers are this process)."""
    def now() -> dict[str, float]:
        return stack.cpu() | {"streamReaders": time.process_time()}
    before, started = now(), time.perf_counter()
    figures = await phase
    after, elapsed = now(), time.perf_counter() - started
    return figures, {n: round((after[n] - before[n]) / elapsed, 2) for n in after}


async def streams_beside_posts(settings: Settings, streams: int = 500, rate: float = 100,
                               seconds: float = 15) -> dict[str, Any]:
    """``POST /cases`` latency at ``rate`` requests/s on one API process: with nothing
    else running; with ``streams`` slow 20-cycle cases running but no stream open (the
    control: their events load the broker and Postgres); then with ``streams`` event
    streams open, each following one of those cases. Worker and consumer run."""
    # One key follows every case here (a dashboard's service account, say): its limit of
    # open streams is raised to the scenario's size.
    run = settings.model_copy(update={"worker_concurrency": streams + 64,
                                      "stream_max_per_key": streams + 16,
                                      "stream_max_per_tenant": streams + 16})
    async with namespace(run) as pool:
        key = await api_key(pool, "models:override")
        stack = Processes(run)
        api = stack.spawn("api", "api", "--port", str(run.api_port))
        stack.spawn("worker", "worker")
        stack.spawn("consumer", "consumer")
        base = f"http://127.0.0.1:{run.api_port}"
        try:
            await wait_ready(base)
            alone = await _posts_from_another_process(base, key, rate, seconds)
            async with _client(base, key, streams + 16, 120) as http:
                slow = {"agent": "throughput-probe", "input": {"cycles": 20},
                        "model": {"provider": "scripted", "name": "slow", "latencyMs": 2000}}
                followed = []
                for _ in range(streams):
                    async with http.post("/cases", json=slow) as reply:
                        followed.append((await reply.json())["caseId"])
                # The control: the same running cases, no stream open yet.
                busy, busy_cpu = await _with_cores(
                    stack, _posts_from_another_process(base, key, rate, seconds))
                received, stop = [0], asyncio.Event()
                opened = [asyncio.Event() for _ in followed]
                holders = [asyncio.create_task(_hold_stream(http, f"/cases/{case}/stream",
                                                            received, ready, stop))
                           for case, ready in zip(followed, opened, strict=True)]
                await asyncio.wait_for(asyncio.gather(*(o.wait() for o in opened)), 120)
                before, started = received[0], time.perf_counter()
                loaded, cpu = await _with_cores(
                    stack, _posts_from_another_process(base, key, rate, seconds))
                elapsed = time.perf_counter() - started
                delivered = received[0] - before
                stop.set()
                for holder in holders:
                    holder.cancel()
                await asyncio.gather(*holders, return_exceptions=True)
            rss = peak_rss_mb(api.pid)
        finally:
            stack.stop()
    return {"streams": streams, "alone": alone, "casesRunningNoStream": busy,
            "withStreams": loaded,
            "eventsStreamedPerSecond": round(delivered / elapsed),
            "coresBusyNoStream": busy_cpu, "coresBusyWithStreams": cpu, "apiPeakRssMb": round(rss)}


async def case_reads(settings: Settings, cases: int = 20, requests: int = 2000
                     ) -> dict[str, Any]:
    """What one ``GET /cases/{id}`` costs, the view people read (status, answer, its
    trail verified and its shown values checked against the signed bytes): ``cases``
    decided 10-cycle cases, then ``requests`` reads one at a time over real HTTP,
    round-robin; p50/p99 and the API's CPU per read."""
    async with namespace(settings) as pool:
        key = await api_key(pool)
        stack = Processes(settings)
        stack.spawn("api", "api", "--port", str(settings.api_port))
        stack.spawn("worker", "worker")
        stack.spawn("consumer", "consumer")
        base = f"http://127.0.0.1:{settings.api_port}"
        try:
            await wait_ready(base)
            async with httpx.AsyncClient(base_url=base, timeout=30,
                                         headers={"Authorization": f"Bearer {key}"}) as http:
                ids = []
                for _ in range(cases):
                    reply = await http.post("/cases", json={
                        "agent": "throughput-probe", "input": {"cycles": 10}})
                    ids.append(reply.json()["caseId"])
                for case_id in ids:
                    for _ in range(600):
                        if (await http.get(f"/cases/{case_id}")).json()["status"] not in (
                                "queued", "running"):
                            break
                        await asyncio.sleep(0.1)
                for case_id in ids[:5]:  # warm: plans, pools, imports
                    (await http.get(f"/cases/{case_id}")).raise_for_status()
                times: list[float] = []
                before = stack.cpu()["api"]
                for n in range(requests):
                    started = time.perf_counter()
                    reply = await http.get(f"/cases/{ids[n % len(ids)]}")
                    times.append((time.perf_counter() - started) * 1000)
                    reply.raise_for_status()
                    assert reply.json()["integrity"]["verified"], reply.text
                api_cpu = stack.cpu()["api"] - before
        finally:
            stack.stop()
    return {"cases": cases, "requests": requests, **percentiles(times),
            "apiCpuMicrosecondsPerRead": round(api_cpu / requests * 1e6)}


async def main(argv: list[str]) -> None:
    if argv[0] == "post":  # the load generator's own process
        base, key, rate, seconds = argv[1:5]
        print(orjson.dumps(await post_at_rate(base, key, float(rate), float(seconds))).decode())
        return
    size = int(argv[1]) if len(argv) > 1 else None
    if argv[0] == "search":
        result = await search_at_scale(bench_settings(api_port=8795), size or 1_000_000)
    elif argv[0] == "reads":
        result = await case_reads(bench_settings(api_port=8797), requests=size or 2000)
    else:
        result = await streams_beside_posts(bench_settings(api_port=8796), size or 500)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
