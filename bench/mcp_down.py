"""One MCP server down holds no case: ``POST /cases`` → ``CASE_STARTED`` p99 for an agent
whose tools come from two MCP servers, with both up and with one of them down (a
Streamable HTTP endpoint nobody answers), on the real stack. Target: within 2x.

Each case is posted at its time (open loop, ``rate`` a second) and timed from its POST
to its ``CASE_STARTED``'s ``occurredAt`` (the worker's clock: the moment the case was
offered its tools).

Usage: python -m bench.mcp_down [cases] [rate]
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from typing import Any

import asyncpg
import httpx
from pydantic import BaseModel

from bench.harness import (
    Processes,
    api_key,
    bench_settings,
    namespace,
    percentiles,
    wait_ready,
    wait_rows,
)
from casetrail import FINAL_ANSWER, Agent, AssistantTurn, Limits, McpTool, call
from casetrail.config import McpServer

PORT = 8793
SERVER = [sys.executable, "-m", "bench.mcp_server"]


class Nothing(BaseModel):
    note: str = ""


PROBE = Agent(
    name="mcp-probe", version="1.0.0", description="Offered two MCP servers' tools; answers "
    "at once (the benchmark times the start).", instructions="Answer.", input=Nothing,
    answer=Nothing, tools=[McpTool("left", "document"), McpTool("right", "document")],
    limits=Limits(max_cycles=2, deadline_seconds=60),
    script=lambda _messages: AssistantTurn(text="Done.", tool_calls=(
        call(FINAL_ANSWER, "final", note="started"),)))


def servers(right_down: bool) -> list[McpServer]:
    left = McpServer(name="left", transport="stdio", command=SERVER, timeout_seconds=10)
    if right_down:  # nothing listens there: every read of it fails
        right = McpServer(name="right", transport="http", timeout_seconds=10,
                          url=f"http://127.0.0.1:{_free_port()}/mcp")
    else:
        right = McpServer(name="right", transport="stdio", command=SERVER, timeout_seconds=10)
    return [left, right]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def starts(right_down: bool, cases: int, rate: float) -> dict[str, Any]:
    """Post ``cases`` cases at ``rate`` a second; each one's POST → CASE_STARTED."""
    settings = bench_settings(api_port=PORT, agents=["bench.mcp_down:PROBE"],
                              mcp_servers=servers(right_down))
    async with namespace(settings) as pool:
        key = await api_key(pool)
        stack = Processes(settings)
        for name in ("api", "worker", "consumer", "capability-worker"):
            stack.spawn(name, *((name, "--port", str(PORT)) if name == "api" else (name,)))
        base = f"http://127.0.0.1:{PORT}"
        try:
            await wait_ready(base)
            await asyncio.sleep(3.0)  # settled: the worker has read the catalogs it can
            sent = await _post(base, key, cases, rate)
            await wait_rows(pool, "SELECT count(*) FROM event_log WHERE event_type = "
                            "'CASE_STARTED'", cases, 300)
            latencies = await _started(pool, sent)
        finally:
            stack.stop()
    return percentiles([s * 1000 for s in latencies])


async def _post(base: str, key: str, cases: int, rate: float) -> dict[str, float]:
    sent: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=base, timeout=30, headers={
            "Authorization": f"Bearer {key}"}) as client:
        async def one(at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            posted = time.time()
            reply = await client.post("/cases", json={"agent": "mcp-probe", "input": {}})
            if reply.status_code != 202:
                raise RuntimeError(f"POST /cases: {reply.status_code} {reply.text}")
            sent[reply.json()["caseId"]] = posted

        start = time.monotonic()
        await asyncio.gather(*(one(start + i / rate) for i in range(cases)))
    return sent


async def _started(pool: asyncpg.Pool, sent: dict[str, float]) -> list[float]:
    rows = await pool.fetch("SELECT case_id::text, extract(epoch FROM occurred_at) AS at "
                            "FROM event_log WHERE event_type = 'CASE_STARTED'")
    return [float(r["at"]) - sent[r["case_id"]] for r in rows if r["case_id"] in sent]


async def one_server_down(cases: int = 300, rate: float = 20.0) -> dict[str, Any]:
    """Both runs and their ratio (the ``make bench`` row)."""
    up = await starts(False, cases, rate)
    down = await starts(True, cases, rate)
    return {"cases": cases, "rate": rate,
            **{f"allUp{k.capitalize()}Ms": round(v, 1) for k, v in up.items()},
            **{f"oneDown{k.capitalize()}Ms": round(v, 1) for k, v in down.items()},
            "p99Ratio": round(down["p99"] / up["p99"], 2) if up["p99"] else None}


if __name__ == "__main__":
    count, per_second = (sys.argv[1:] + ["300", "20"][len(sys.argv) - 1:])[:2]
    print(asyncio.run(one_server_down(int(count), float(per_second))))
