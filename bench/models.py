"""Real providers at scale: 1,000 concurrent loan cases through the real ``openai`` and
``anthropic`` providers (casetrail's shared clients, real HTTP) against a local server
that answers every request after 300 ms, in each wire format (``bench.slow_model``).

The server is a plain asyncio protocol in a process of its own, so it is not the
bottleneck: its ceiling, a plain aiohttp client's requests/s at the same concurrency,
is printed beside each figure, with the CPU it took. A case takes two model turns (a
call of the local ``debt-to-income`` tool, then the decision), so the ideal is
``concurrency / 0.3 s`` turns a second. Reported: turns/s and their share of the ideal,
p50/p99 turn latency as the worker saw it (time between consecutive events of a case),
TCP connections the server accepted, the worker's CPU seconds and peak RSS.
``python -m bench.models [CASES] [CONCURRENCY …]``."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.e2e import post_cases, sampled
from bench.harness import (
    CpuTrace,
    Processes,
    api_key,
    bench_settings,
    cpu_seconds,
    namespace,
    peak_rss_mb,
    percentiles,
    wait_ready,
    wait_rows,
)
from bench.slow_model import TURN_SECONDS, Provider
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import ModelEndpoint


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class SlowModelProcess:
    """``bench.slow_model`` running in a process of its own."""

    provider: Provider
    port: int
    process: asyncio.subprocess.Process

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}" + ("/v1" if self.provider == "openai" else "")

    @property
    def path(self) -> str:
        return "/chat/completions" if self.provider == "openai" else "/v1/messages"

    async def stats(self) -> dict[str, int]:
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{self.port}/stats") as reply:
            counts: dict[str, int] = orjson.loads(await reply.read())
            return counts


@asynccontextmanager
async def slow_model(provider: Provider) -> AsyncIterator[SlowModelProcess]:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.slow_model", provider, str(port),
        stdout=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        ready = await asyncio.wait_for(process.stdout.readline(), 30)
        if ready.strip() != b"ready":
            raise RuntimeError(f"the model server did not start: {ready!r}")
        yield SlowModelProcess(provider, port, process)
    finally:
        process.terminate()
        await process.wait()


async def server_ceiling(provider: Provider, concurrency: int, seconds: float = 3.0
                         ) -> tuple[float, float]:
    """Requests/s the server answers a plain aiohttp client at ``concurrency`` (from this
    process), and the server's CPU seconds per second meanwhile."""
    async with slow_model(provider) as server:
        deadline = time.perf_counter() + seconds
        done = 0
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            async def loop() -> None:
                nonlocal done
                while time.perf_counter() < deadline:
                    async with session.post(server.base_url + server.path,
                                            data=b'{"messages": []}') as r:
                        await r.read()
                    done += 1

            cpu = cpu_seconds(server.process.pid)
            started = time.perf_counter()
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            elapsed = time.perf_counter() - started
            cpu = cpu_seconds(server.process.pid) - cpu
    return done / elapsed, cpu / elapsed


def _timeline(rows: list[Any], slots: int
              ) -> tuple[int, list[float], float, float, list[float]]:
    """From the stored events: model turns, the gaps between a case's turns (ms), the
    run's span (s), the slot-seconds cases held, and the slots' hand-overs (ms)."""
    turns, gaps = 0, []
    previous: dict[Any, float] = {}
    starts, ends = [], []
    # A case holds its slot from its start to its last turn (the worker frees the slot
    # once the outcome is decided, before the terminal event is confirmed).
    first: dict[Any, float] = {}
    decided: dict[Any, float] = {}
    for row in rows:
        t = float(row["t"])
        if row["event_type"] == "CASE_STARTED":
            starts.append(t)
            first.setdefault(row["case_id"], t)
        elif row["event_type"] == "REACT_CYCLE":
            turns += 1
            gaps.append((t - previous[row["case_id"]]) * 1000)
            decided[row["case_id"]] = t
        else:
            ends.append(t)
        previous[row["case_id"]] = t
    span = max(ends) - min(starts)
    busy = sum(decided[c] - first[c] for c in decided)
    # A slot's hand-over: from a case's last turn to the start of the case that took its
    # place (the k-th start after the first wave follows the k-th freed slot).
    handovers = [(b - a) * 1000 for a, b in zip(sorted(decided.values()),
                                                 sorted(first.values())[slots:], strict=False)]
    return turns, gaps, span, busy, handovers


async def run_cases(provider: Provider, cases: int, concurrency: int,
                    profile: Path | None = None, event_loop: str = "uvloop",
                    workers: int = 1) -> dict[str, Any]:
    """``profile``: a directory where py-spy writes the worker's sampled stacks
    (``worker.txt``) while the cases run (``python -m bench.profile models``);
    ``workers``: worker processes sharing ``concurrency`` (their CPU is added)."""
    pool_size = max(256, concurrency)
    async with slow_model(provider) as server:
        settings = bench_settings(
            api_port=free_port(), worker_concurrency=concurrency // workers,
            model_pool_size=pool_size, event_loop=event_loop,
            model_endpoints=[ModelEndpoint(name="slow", provider=provider,
                                           base_url=server.base_url)])
        async with namespace(settings) as pool:
            key = await api_key(pool, "models:override")
            stack = Processes(settings)
            stack.spawn("api", "api", "--port", str(settings.api_port))
            stack.spawn("consumer", "consumer")
            stack.spawn("ledger", "ledger")  # every feature on: the transparency log too
            try:
                base = f"http://127.0.0.1:{settings.api_port}"
                await wait_ready(base)
                body = {"agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0],
                        "model": {"provider": provider, "name": "fake", "endpoint": "slow"}}
                # Every case is queued before the worker starts: what is measured is the
                # worker carrying them at the model's pace, not this script posting them.
                await post_cases(base, body, cases, key)
                started = [stack.spawn(f"worker-{i}" if i else "worker", "worker")
                           for i in range(workers)]
                worker = started[0]
                traces = [CpuTrace(w.pid) for w in started]
                server_cpu = cpu_seconds(server.process.pid)
                # The model's refer waits for a person (the loan officer's review): the
                # model's part of the case ends there, as it does with a terminal event.
                with sampled(worker.pid, profile and profile / "worker.txt"):
                    await wait_rows(pool, "SELECT count(*) FROM event_log WHERE event_type "
                                    "IN ('CASE_COMPLETED', 'CASE_FAILED', 'CASE_TIMED_OUT', "
                                    "'CASE_AWAITING_REVIEW')", cases, timeout=600)
                for trace in traces:
                    trace.stop()
                # The worker's CPU from its first case on: its start-up (imports, ~0.3
                # CPU-s) is no model turn's.
                first = await pool.fetchval("SELECT extract(epoch FROM min(occurred_at)) "
                                            "FROM event_log")
                cpu = sum(cpu_seconds(w.pid) - trace.at(float(first))
                          for w, trace in zip(started, traces, strict=True))
                server_cpu = cpu_seconds(server.process.pid) - server_cpu
                rss = max(peak_rss_mb(w.pid) for w in started)
                rows = await pool.fetch(
                    "SELECT case_id, event_type, extract(epoch FROM occurred_at) AS t "
                    "FROM event_log ORDER BY case_id, attempt, seq")
                answered = await pool.fetchval(
                    "SELECT count(*) FROM cases WHERE status IN ('completed', "
                    "'awaiting_review')")
            finally:
                stack.stop()
        served = await server.stats()
    turns, gaps, span, busy, handovers = _timeline(rows, min(concurrency, cases))
    slots = min(concurrency, cases)
    ideal = min(concurrency, cases) / TURN_SECONDS
    latency = percentiles(gaps)
    ceiling, ceiling_cpu = await server_ceiling(provider, min(concurrency, cases))
    return {
        "provider": provider, "cases": cases, "eventLoop": event_loop, "workers": workers,
        "answered": answered, "concurrency": concurrency, "poolSize": pool_size,
        "turns": turns, "seconds": round(span, 2),
        "turnsPerSecond": round(turns / span, 1), "idealTurnsPerSecond": round(ideal, 1),
        "shareOfIdeal": round(turns / span / ideal, 3),
        "slotsBusy": round(busy / (slots * span), 3),
        "handoverP50Ms": round(percentiles(handovers)["p50"], 1) if len(handovers) > 1
        else None,
        "turnP50Ms": round(latency["p50"], 1), "turnP99Ms": round(latency["p99"], 1),
        "connectionsOpened": served["connections"], "requestsServed": served["requests"],
        "workerCpuSeconds": round(cpu, 2), "workerPeakRssMb": round(rss, 1),
        "serverCpuSeconds": round(server_cpu, 2),
        "serverCeilingPerSecond": round(ceiling, 1),
        "serverCeilingShare": round(ceiling / ideal, 3),
        "serverCeilingCpu": round(ceiling_cpu, 2),
    }


async def main(args: list[str]) -> None:
    numbers = [int(a) for a in args if a.isdigit()]
    cases, levels = (numbers[0], numbers[1:]) if numbers else (1000, [])
    for provider in ("openai", "anthropic"):
        for level in levels or [256]:
            print(await run_cases(provider, cases, level), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
