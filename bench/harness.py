"""Shared pieces for the benchmarks: a private namespace and database, the stack's
processes, and small measuring helpers."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from casetrail.adapters.store import ApiKeyStore
from casetrail.components.supervisor import component_command
from casetrail.config import Settings
from casetrail.contract.integrity import Signer
from casetrail.ledger.log_key import write_log_key
from casetrail.ledger.note import NoteSigner
from casetrail.ops.setup import rabbitmqctl_environment, remove, setup
from casetrail.trail.keyfile import worker_signer, write_signer

ROOT = Path(__file__).resolve().parent.parent


_KEYS = tempfile.TemporaryDirectory(prefix="casetrail-bench-keys-")
LOG_ORIGIN = "casetrail.bench/log"
"""The bench stacks' signing keys; removed when the benchmark process exits."""


def bench_settings(**overrides: object) -> Settings:
    """Settings of a private bench stack, with a signing key of its own (made here;
    ``namespace`` registers it)."""
    suffix = uuid.uuid4().hex[:6]
    base = Settings()
    url = base.database_url.rsplit("/", 1)[0] + f"/casetrail_bench_{suffix}"
    key_file = Path(_KEYS.name) / f"casetrail-bench-{suffix}.signing-key.pem"
    write_signer(key_file, Signer.generate())
    action_key = Path(_KEYS.name) / f"casetrail-bench-{suffix}.action-key.pem"
    write_signer(action_key, Signer.generate())
    audit_key = Path(_KEYS.name) / f"casetrail-bench-{suffix}.audit-key.pem"
    write_signer(audit_key, Signer.generate())
    log_key = Path(_KEYS.name) / f"casetrail-bench-{suffix}.log-key"
    write_log_key(log_key, NoteSigner.generate(LOG_ORIGIN))
    return base.model_copy(update={
        "database_url": url, "namespace": f"casetrail-bench-{suffix}",
        "signing_key_file": str(key_file), "action_key_file": str(action_key),
        "audit_key_file": str(audit_key),
        "bench_mode": True, "max_cycles_cap": 200,
        "log_key_file": str(log_key), "log_origin": LOG_ORIGIN,
        # A load generator is one tenant starting thousands of cases a second.
        "tenant_max_active_cases": 1_000_000, "tenant_max_starts_per_minute": 10_000_000,
        "tenant_max_key_searches_per_minute": 10_000_000,
        **overrides,
    })


async def api_key(pool: asyncpg.Pool, *extra: str) -> str:
    """An API key for a bench stack's requests (tenant ``default``)."""
    _, key = await ApiKeyStore(pool).create("default", ("cases:start", "cases:read", *extra),
                                            "bench")
    return key


@dataclass
class Processes:
    settings: Settings
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    """More environment for every child (e.g. the OTEL_* variables)."""

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(f"/tmp/{self.settings.namespace}-{name}.log", "wb")  # noqa: SIM115
        child = subprocess.Popen(component_command(*args),
                                 env=self.settings.environment(**self.env),
                                 stdout=log, stderr=log)
        self.children[name] = child
        return child

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each child and of the services (RabbitMQ, Postgres)."""
        return {n: cpu_seconds(c.pid) for n, c in self.children.items()} | service_cpu()

    def stop(self, *names: str) -> None:
        targets = [self.children[n] for n in names] if names else list(self.children.values())
        for child in targets:
            if child.poll() is None:
                child.terminate()
        for child in targets:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()


@asynccontextmanager
async def namespace(settings: Settings, keep: bool = False) -> AsyncIterator[asyncpg.Pool]:
    """A private database and bus namespace, set up as ``casetrail setup`` does (every
    component under its own identity), removed afterwards (unless ``keep``: a cached
    database the next run uses again)."""
    await setup(settings)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=4)
    assert pool is not None
    signer = worker_signer(settings)
    await pool.execute("INSERT INTO signing_keys (key_id, public_key) VALUES ($1, $2) "
                       "ON CONFLICT DO NOTHING", signer.key_id, signer.public_key)
    try:
        yield pool
    finally:
        await pool.close()
        if not keep:
            await remove(settings)


async def wait_ready(base_url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base_url) as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{base_url} not ready")


async def wait_rows(pool: asyncpg.Pool, sql: str, expected: int, timeout: float = 300,
                    *args: object) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = await pool.fetchval(sql, *args)
        if got >= expected:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {got} of {expected} rows after {timeout}s: {sql}")
        await asyncio.sleep(0.05)


def percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"p50": q[49], "p95": q[94], "p99": q[98], "max": ordered[-1]}


def peak_rss_mb(pid: int, field: str = "VmHWM") -> float:
    """A process's peak resident memory (``VmRSS``: its resident memory now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def unacked(namespace: str) -> int:
    """Messages delivered and not yet acked on a namespace's queues (``rabbitmqctl``)."""
    listed = subprocess.run(["rabbitmqctl", "-q", "list_queues", "--no-table-headers", "name",
                             "messages_unacknowledged"], check=True, capture_output=True,
                            text=True, timeout=60, env=rabbitmqctl_environment()).stdout
    return sum(int(n) for name, n in (line.split() for line in listed.splitlines()
                                      if line.strip()) if name.startswith(namespace))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class CpuTrace:
    """A process's CPU seconds read every few milliseconds, to tell how much it had
    spent at a given moment (its start-up done, say)."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.pid, self.interval = pid, interval
        self.readings: list[tuple[float, float]] = []
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            self.readings.append((time.time(), cpu_seconds(self.pid)))
            await asyncio.sleep(self.interval)

    def stop(self) -> None:
        self._task.cancel()

    def at(self, moment: float) -> float:
        """CPU seconds by ``moment`` (the last reading before it)."""
        return max((cpu for t, cpu in self.readings if t <= moment), default=0.0)


def service_cpu() -> dict[str, float]:
    """CPU seconds so far of the broker (beam) and of every Postgres process."""
    totals = {"rabbitmq": 0.0, "postgres": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            if name.startswith("beam"):
                totals["rabbitmq"] += cpu_seconds(int(entry.name))
            elif name.startswith("postgres"):
                totals["postgres"] += cpu_seconds(int(entry.name))
        except (OSError, IndexError):
            continue
    return totals


def median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose ``key`` is the median (the lower middle one for an even count)."""
    return sorted(runs, key=lambda run: run[key])[(len(runs) - 1) // 2]
