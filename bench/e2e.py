"""End-to-end durable cycles/s: REST → worker → bus → consumer → Postgres."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson

from bench.harness import (
    Processes,
    api_key,
    bench_settings,
    namespace,
    wait_ready,
    wait_rows,
)
from casetrail.adapters.store.tree import TREE_SIZE_SQL
from casetrail.config import Settings

PORT = 8790
_RUN_CASES = ("SELECT count(*) FROM cases WHERE tenant_id = 'default' "
              "AND created_at >= $1")
"""This run's cases (every bench case is the tenant's; the search index serves it)."""
_RUN_EVENTS = (
    "SELECT extract(epoch FROM max(e.recorded_at)), "
    "count(*) FILTER (WHERE e.event_type = 'REACT_CYCLE'), count(*) "
    "FROM cases c JOIN event_log e USING (case_id) "
    "WHERE c.tenant_id = 'default' AND c.created_at >= $1")
"""This run's last commit, cycles and events."""


def ab_post(url: str, body: dict[str, Any], requests: int, concurrency: int,
            key: str) -> dict[str, float]:
    """POST ``body`` ``requests`` times with ApacheBench (keep-alive): a client light
    enough not to be the bottleneck on a 2-core machine. Fails on any non-2xx."""
    with tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False) as f:
        f.write(orjson.dumps(body))
    out = subprocess.run(
        ["ab", "-q", "-k", "-n", str(requests), "-c", str(concurrency), "-p", f.name,
         "-T", "application/json", "-H", f"Authorization: Bearer {key}", url],
        capture_output=True, text=True, check=True,
    ).stdout
    figures = {}
    for line in out.splitlines():
        if line.startswith("Requests per second:"):
            figures["requestsPerSecond"] = float(line.split()[3])
        elif line.startswith(("Non-2xx responses:", "Failed requests:")) and \
                int(line.split(":")[1].split()[0]):
            raise RuntimeError(f"ab saw errors: {line}")
        elif line.strip().startswith(("50%", "95%", "99%")):
            key, value = line.split()[:2]
            figures[f"p{key.rstrip('%')}Ms"] = float(value)
    return figures


async def post_cases(base_url: str, body: dict[str, Any], cases: int, key: str,
                     concurrency: int = 32) -> dict[str, float]:
    return await asyncio.to_thread(ab_post, f"{base_url}/cases", body, cases, concurrency,
                                   key)


def sample(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` (100 Hz, without pausing it) until SIGINT, into ``out``."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
         "--rate", "100", "--nonblocking", "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextmanager
def sampled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy sampling ``pid`` into ``out`` while the block runs (nothing if ``out`` is
    None)."""
    sampler = None if out is None else sample(pid, out)
    try:
        yield
    finally:
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)
            sampler.wait(60)


async def end_to_end(cases: int, cycles: int, workers: int = 1,
                     settings: Settings | None = None,
                     env: dict[str, str] | None = None, consumers: int = 1,
                     profile: Path | None = None, result_bytes: int = 0,
                     keep: bool = False) -> dict[str, Any]:
    """``env``: more environment for the components (the OTEL_* variables); ``profile``:
    a directory where py-spy writes the API's, the first worker's and the consumer's
    sampled stacks (collapsed, ``<name>.txt``) while the cases run (bench/profile.py);
    ``keep``: ``settings`` name a cached database that holds a history already
    (bench/history.py), kept afterwards. Every count is of this run's cases alone, read
    through indexes, so a log of 25,000,000 events costs the measurement nothing more."""
    settings = settings or bench_settings(api_port=PORT)
    async with namespace(settings, keep=keep) as pool:
        key = await api_key(pool)
        stack = Processes(settings, env=env or {})
        stack.spawn("api", "api", "--port", str(settings.api_port))
        for i in range(workers):
            stack.spawn(f"worker-{i}", "worker")
        for i in range(consumers):
            stack.spawn("consumer" if i == 0 else f"consumer-{i}", "consumer")
        stack.spawn("ledger", "ledger")  # every feature on: the transparency log too
        sampling = ExitStack()  # py-spy on three of them, when profiling
        try:
            await wait_ready(f"http://127.0.0.1:{settings.api_port}")
            body: dict[str, Any] = {"agent": "throughput-probe", "input": {"cycles": cycles}}
            if result_bytes:
                body["input"]["resultBytes"] = result_bytes
            if cycles > 50:  # the agent's own limit; the bench's cap allows more
                body["limits"] = {"maxCycles": cycles, "deadlineSeconds": 600}
            for name in ("api", "worker-0", "consumer"):
                sampling.enter_context(sampled(stack.children[name].pid,
                                               profile and profile / f"{name}.txt"))
            tree = await pool.fetchval(TREE_SIZE_SQL)
            since = await pool.fetchval("SELECT clock_timestamp()")
            before = stack.cpu()
            started = time.time()
            await post_cases(f"http://127.0.0.1:{settings.api_port}", body, cases, key)
            posted = time.time()
            await wait_rows(pool, _RUN_CASES + " AND status = 'completed'", cases, 300, since)
            counted = await pool.fetchrow(_RUN_EVENTS, since)
            assert counted is not None
            last, total_cycles, events = counted
            after = stack.cpu()
            sampling.close()
            # The log keeps up: a checkpoint holding every stored event, how long after.
            await wait_rows(pool, "SELECT count(*) FROM ledger_checkpoints "
                            "WHERE tree_size >= $1", 1, 120, tree + events)
            logged = time.time()
        finally:
            sampling.close()
            stack.stop()
    elapsed = float(last) - started
    return {
        "cases": cases, "cyclesPerCase": cycles, "workers": workers, "consumers": consumers,
        "cycles": total_cycles, "seconds": round(elapsed, 3),
        "postSeconds": round(posted - started, 3),
        "cyclesPerSecond": round(total_cycles / elapsed, 1),
        "cpuSeconds": {n: round(after[n] - before[n], 2) for n in after},
        "events": events,
        "checkpointAfterLastCommitSeconds": round(logged - float(last), 2),
    }


if __name__ == "__main__":
    import sys

    n, k, w = (int(a) for a in (sys.argv[1:] + ["1000", "10", "1"][len(sys.argv) - 1:]))
    print(asyncio.run(end_to_end(n, k, w)))
