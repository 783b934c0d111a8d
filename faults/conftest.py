"""Fixtures for the fault suite: a private namespace and database, the real stack as
processes, and the levers that break things (broker, database, processes)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from casetrail.adapters.bus.connection import connect
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import ApiKeyStore, KeyRegistry, create_pool
from casetrail.config import Settings
from casetrail.contract.integrity import Signer
from casetrail.ledger.log_key import write_log_key
from casetrail.ledger.note import NoteSigner
from casetrail.ops.setup import rabbitmqctl_environment, remove, setup
from casetrail.trail.keyfile import write_signer
from faults.checker import Report, declare_witness, table, witness_name
from tests.support.helpers import wait_until
from tests.support.stack import free_port, spawn

REPORTS: list[Report] = []
RESULTS = Path(__file__).resolve().parent / "last-run.md"

# A stack's files default to the user's configuration directory: the suite's own.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="casetrail-faults-config-")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORTS:
        text = table(REPORTS)
        terminalreporter.write_line("\nloss/duplication checker\n" + text)
        RESULTS.write_text(text + "\n")


def pg_cluster(action: str) -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action,
                    *(["-m", "fast"] if action == "stop" else [])], check=True)


def rabbit(action: str) -> None:
    env = rabbitmqctl_environment()
    subprocess.run(["rabbitmqctl", "-q", action], check=True, timeout=120, env=env)
    if action == "start_app":
        subprocess.run(["rabbitmqctl", "-q", "await_startup"], check=True, timeout=120, env=env)


@dataclass
class Stack:
    settings: Settings
    base_url: str
    headers: dict[str, str] = field(default_factory=dict)
    """The API key of the stack's own requests."""
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    capability_metrics: int = 0
    """The capability worker's metrics port (it counts the tool handler's runs)."""

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        extra = {"CASETRAIL_CAPABILITY_METRICS_PORT": str(self.capability_metrics)} \
            if args[0] == "capability-worker" else {}
        self.children[name] = spawn(self.settings, *args, **extra)
        return self.children[name]

    async def tool_runs(self) -> int:
        """How many times the capability worker (since it started) ran a tool handler."""
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{self.capability_metrics}/metrics")).text
        return round(sum(s.value for f in text_string_to_metric_families(text)
                         for s in f.samples
                         if s.name == "casetrail_tool_requests_served_total"
                         and s.labels["outcome"] in ("ok", "error")))

    def kill(self, name: str) -> None:
        child = self.children[name]
        child.kill()
        child.wait()

    def alive(self) -> list[str]:
        return [n for n, c in self.children.items() if c.poll() is None]

    async def ready(self) -> bool:
        try:
            async with httpx.AsyncClient(base_url=self.base_url) as client:
                return (await client.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False


@asynccontextmanager
async def running_stack(tmp_path: Path, **overrides: Any) -> AsyncIterator[Stack]:
    """The whole stack as processes in a namespace of its own (``overrides``: settings,
    e.g. the cluster's AMQP URLs), torn down afterwards."""
    suffix = uuid.uuid4().hex[:8]
    base = Settings()
    key_file = tmp_path / "worker-signing-key.pem"
    signer = Signer.generate()
    write_signer(key_file, signer)
    action_key = tmp_path / "api-action-key.pem"
    write_signer(action_key, Signer.generate())  # the API's: setup registers it
    log_key = tmp_path / "log-key"
    write_log_key(log_key, NoteSigner.generate("casetrail.faults/log"))
    settings = base.model_copy(update={
        "database_url": base.database_url.rsplit("/", 1)[0] + f"/casetrail_faults_{suffix}",
        "namespace": f"casetrail-faults-{suffix}",
        "lease_seconds": 15.0,
        "tool_timeout_seconds": 2.0,
        "signing_key_file": str(key_file), "action_key_file": str(action_key),
        "log_key_file": str(log_key), "log_origin": "casetrail.faults/log",
        "checkpoint_seconds": 0.5,
        "secrets_file": str(tmp_path / "identities.json"),
        "bench_mode": True,  # slow scripted models (latencyMs)
        **overrides,
    })
    await setup(settings)  # every component under its own least-privileged identity
    # Registered before anything runs: fault scenarios also publish signed events
    # themselves, and the consumer must know the key from the first one.
    keys_pool = await create_pool(settings.database_url, max_size=1)
    await KeyRegistry(keys_pool).register(signer.key_id, signer.public_key)
    _, api_key = await ApiKeyStore(keys_pool).create(
        "default", ("cases:start", "cases:read", "cases:cancel", "models:override"), "faults")
    await keys_pool.close()
    topology = Topology(settings.namespace)
    connection = await connect(settings.amqp_url, "casetrail-faults")
    await declare_witness(connection, topology)
    await connection.close()
    port = free_port()
    running = Stack(settings, f"http://127.0.0.1:{port}",
                    {"Authorization": f"Bearer {api_key}"}, capability_metrics=free_port())
    running.start("api", "api", "--port", str(port))
    running.start("worker", "worker")
    running.start("consumer", "consumer")
    running.start("ledger", "ledger")
    running.start("capability-worker", "capability-worker")
    await wait_until(running.ready, timeout=60, interval=0.2)
    try:
        yield running
    finally:
        for child in running.children.values():
            if child.poll() is None:
                child.terminate()
        for child in running.children.values():
            try:
                await asyncio.to_thread(child.wait, 30)
            except subprocess.TimeoutExpired:
                child.kill()
        connection = await connect(settings.amqp_url, "casetrail-faults")
        channel = await connection.channel()
        await channel.queue_delete(witness_name(topology), if_unused=False, if_empty=False)
        await connection.close()
        await remove(settings)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(tmp_path) as running:
        yield running


@pytest.fixture
async def pool(stack: Stack) -> AsyncIterator[asyncpg.Pool]:
    created = await asyncpg.create_pool(stack.settings.database_url, min_size=1, max_size=4)
    assert created is not None
    yield created
    await created.close()
