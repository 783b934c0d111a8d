"""Real providers at scale: 1,000 concurrent loan cases through the real ``openai`` and
``anthropic`` providers (the official SDKs, casetrail's shared clients) against a local
server that answers every request after 300 ms, in each wire format.

The server is a plain asyncio HTTP/1.1 server with keep-alive, so it is not the
bottleneck: its own ceiling, with an aiohttp client at the same concurrency, is printed
beside each figure. A case takes two model turns (a call of the local ``debt-to-income``
tool, then the decision), so the ideal is ``concurrency / 0.3 s`` turns a second.
Reported: turns/s and their share of the ideal, p50/p99 turn latency as the worker saw
it (time between consecutive events of a case), TCP connections the server accepted,
the worker's CPU seconds and peak RSS.
``python -m bench.models [CASES] [CONCURRENCY …]``."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import orjson

from bench.e2e import post_cases
from bench.harness import (
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
from service.agents.loan_officer import SAMPLE_APPLICATIONS
from service.config import ModelEndpoint

TURN_SECONDS = 0.3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port

Provider = Literal["openai", "anthropic"]
_TOOL_RESULT = re.compile(rb'"role":\s*"tool"|"tool_result"')
_ANSWER = ('The debt-to-income ratio is acceptable.\n```json\n{"decision": "approve", '
           '"rationale": "within policy"}\n```')


def _reply(provider: Provider, second_turn: bool) -> bytes:
    if provider == "openai":
        message: dict[str, Any] = {"role": "assistant", "content": _ANSWER} if second_turn \
            else {"role": "assistant", "content": "I will check the debt-to-income ratio.",
                  "tool_calls": [{"id": "call_1", "type": "function", "function": {
                      "name": "debt-to-income",
                      "arguments": '{"monthlyDebt": 2100, "monthlyIncome": 9000}'}}]}
        return orjson.dumps({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "fake",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "stop" if second_turn else "tool_calls"}],
            "usage": {"prompt_tokens": 500, "completion_tokens": 30, "total_tokens": 530}})
    blocks = [{"type": "text", "text": _ANSWER}] if second_turn else [
        {"type": "text", "text": "I will check the debt-to-income ratio."},
        {"type": "tool_use", "id": "toolu_1", "name": "debt-to-income",
         "input": {"monthlyDebt": 2100, "monthlyIncome": 9000}}]
    return orjson.dumps({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "fake",
        "content": blocks, "stop_reason": "end_turn" if second_turn else "tool_use",
        "stop_sequence": None, "usage": {"input_tokens": 500, "output_tokens": 30}})


@dataclass
class SlowModelServer:
    """Answers each request after ``TURN_SECONDS``; counts the connections it accepted."""

    provider: Provider
    connections: int = 0
    requests: int = 0
    port: int = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
                body = await reader.readexactly(length)
                await asyncio.sleep(TURN_SECONDS)
                answer = _reply(self.provider, bool(_TOOL_RESULT.search(body)))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: " + str(len(answer)).encode() + b"\r\n\r\n"
                             + answer)
                await writer.drain()
                self.requests += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> asyncio.Server:
        self.port = free_port()
        return await asyncio.start_server(self._serve, "127.0.0.1", self.port, backlog=4096)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}" + ("/v1" if self.provider == "openai" else "")


async def server_ceiling(provider: Provider, concurrency: int, seconds: float = 3.0) -> float:
    """Requests/s the server answers to an aiohttp client at ``concurrency``."""
    server = SlowModelServer(provider)
    listening = await server.start()
    path = "/chat/completions" if provider == "openai" else "/v1/messages"
    deadline = time.perf_counter() + seconds
    done = 0
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.post(server.base_url + path, data=b'{"messages": []}') as r:
                    await r.read()
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    listening.close()
    return done / elapsed


async def run_cases(provider: Provider, cases: int, concurrency: int) -> dict[str, Any]:
    server = SlowModelServer(provider)
    listening = await server.start()
    pool_size = max(256, concurrency)
    settings = bench_settings(
        api_port=free_port(), worker_concurrency=concurrency, model_pool_size=pool_size,
        model_endpoints=[ModelEndpoint(name="slow", provider=provider,
                                       base_url=server.base_url)])
    try:
        async with namespace(settings) as pool:
            key = await api_key(pool, "models:override")
            stack = Processes(settings)
            stack.spawn("api", "api", "--port", str(settings.api_port))
            stack.spawn("consumer", "consumer")
            try:
                base = f"http://127.0.0.1:{settings.api_port}"
                await wait_ready(base)
                body = {"agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0],
                        "model": {"provider": provider, "name": "fake", "endpoint": "slow"}}
                # Every case is queued before the worker starts: what is measured is the
                # worker carrying them at the model's pace, not this script posting them.
                await post_cases(base, body, cases, key)
                worker = stack.spawn("worker", "worker")
                cpu_before = cpu_seconds(worker.pid)
                await wait_rows(pool, "SELECT count(*) FROM event_log WHERE event_type IN "
                                "('CASE_COMPLETED', 'CASE_FAILED', 'CASE_TIMED_OUT')", cases,
                                timeout=600)
                cpu = cpu_seconds(worker.pid) - cpu_before
                rss = peak_rss_mb(worker.pid)
                rows = await pool.fetch(
                    "SELECT case_id, event_type, extract(epoch FROM occurred_at) AS t "
                    "FROM event_log ORDER BY case_id, attempt, seq")
                completed = await pool.fetchval(
                    "SELECT count(*) FROM cases WHERE status = 'completed'")
            finally:
                stack.stop()
    finally:
        listening.close()
    turns, gaps = 0, []
    previous: dict[Any, float] = {}
    starts, ends = [], []
    for row in rows:
        t = float(row["t"])
        if row["event_type"] == "CASE_STARTED":
            starts.append(t)
        elif row["event_type"] == "REACT_CYCLE":
            turns += 1
            gaps.append((t - previous[row["case_id"]]) * 1000)
        else:
            ends.append(t)
        previous[row["case_id"]] = t
    span = max(ends) - min(starts)
    # How busy the worker's slots were: case time over slot time.
    first: dict[Any, float] = {}
    last: dict[Any, float] = {}
    for row in rows:
        first.setdefault(row["case_id"], float(row["t"]))
        last[row["case_id"]] = float(row["t"])
    busy = sum(last[c] - first[c] for c in first)
    # A slot's hand-over: from a case's last event to the start of the case that took
    # its place (the k-th start after the first wave follows the k-th end).
    slots = min(concurrency, cases)
    handovers = [(b - a) * 1000 for a, b in zip(sorted(last.values()),
                                                 sorted(first.values())[slots:], strict=False)]
    ideal = min(concurrency, cases) / TURN_SECONDS
    latency = percentiles(gaps)
    return {
        "provider": provider, "cases": cases,
        "completed": completed, "concurrency": concurrency, "poolSize": pool_size,
        "turns": turns, "seconds": round(span, 2),
        "turnsPerSecond": round(turns / span, 1), "idealTurnsPerSecond": round(ideal, 1),
        "shareOfIdeal": round(turns / span / ideal, 3),
        "slotsBusy": round(busy / (slots * span), 3),
        "handoverP50Ms": round(percentiles(handovers)["p50"], 1) if len(handovers) > 1
        else None,
        "turnP50Ms": round(latency["p50"], 1), "turnP99Ms": round(latency["p99"], 1),
        "connectionsOpened": server.connections, "workerCpuSeconds": round(cpu, 2),
        "workerPeakRssMb": round(rss, 1),
        "serverCeilingPerSecond": round(await server_ceiling(provider, min(concurrency,
                                                                            cases)), 1),
    }


async def main(args: list[str]) -> None:
    numbers = [int(a) for a in args if a.isdigit()]
    cases, levels = (numbers[0], numbers[1:]) if numbers else (1000, [])
    for provider in ("openai", "anthropic"):
        for level in levels or [256]:
            print(await run_cases(provider, cases, level), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
