"""The transparency-log stack the ledger, restore, audit and retention tests share: the
in-process components of a namespace of their own with a REST client (``serving``), the
ledger as a real process (``Logged``), cases run and logged, a database's backup and
restore as the runbook does them, and what a superuser does behind the triggers' back."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson

from casetrail.adapters.bus.topology import Topology
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.api.log_watch import LogWatch
from casetrail.components.sequencer import ledger_state
from casetrail.components.supervisor import component_command
from casetrail.config import Settings
from casetrail.ledger.log_key import log_signer
from casetrail.ledger.note import Verifier, open_checkpoint
from tests.support.helpers import ended, wait_until
from tests.support.records import without_body_constraint
from tests.support.stack import InProcessStack, in_process_stack, spawn, stop_cleanly


@dataclass
class Logged:
    settings: Settings
    pool: asyncpg.Pool
    stack: InProcessStack
    client: httpx.AsyncClient
    children: dict[str, subprocess.Popen[bytes]]
    log_key: Verifier
    witness_key: Path
    witness: Verifier
    checkpoints: aio_pika.abc.AbstractQueue

    async def start_ledger(self) -> None:
        """Start ``casetrail ledger`` and wait until it holds the log's lock (past its
        start-up checks)."""
        self.children["ledger"] = spawn(self.settings, "ledger")

        async def holding() -> bool:
            return bool(await self.pool.fetchval(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                "WHERE l.locktype = 'advisory' AND a.application_name = 'casetrail-ledger' "
                "AND a.datname = current_database()"))

        await wait_until(holding, timeout=30)

    async def stop_ledger(self) -> None:
        await stop_cleanly({"ledger": self.children.pop("ledger")})

    async def halted(self, reason: str, timeout: float = 30) -> str:
        """Wait until the running ledger says it is halted for ``reason``; its log."""
        path = Path(self.children["ledger"].log_path)  # type: ignore[attr-defined]

        async def said() -> str | None:
            text = path.read_text()  # noqa: ASYNC240
            return text if f"the ledger is halted ({reason})" in text else None

        found: str = await wait_until(said, timeout=timeout)
        return found

    async def stop_halted_ledger(self) -> str:
        """SIGTERM a halted ledger: it exits 3 and says why once more; its log."""
        child = self.children.pop("ledger")
        child.terminate()
        await asyncio.to_thread(child.wait, 30)
        said = Path(child.log_path).read_text()  # type: ignore[attr-defined]  # noqa: ASYNC240
        assert child.returncode == 3, said[-2000:]
        return said

    async def forget_high_water(self) -> None:
        """What an attacker who holds the ledger's host and the broker does besides the
        database: remove the state file and the streams that keep its checkpoints, and
        restart the API, whose watch on the log then reads the streams afresh."""
        ledger_state(self.settings).path.unlink(missing_ok=True)
        topology = Topology(self.settings.namespace)
        connection = await aio_pika.connect(self.settings.amqp_url)
        try:
            channel = await connection.channel()
            for name in (topology.log_head_stream, topology.checkpoints_stream):
                await channel.queue_delete(name, if_unused=False, if_empty=False)
            await topology.declare(channel)
        finally:
            await connection.close()
        app = self.stack.app
        assert app is not None
        forgotten, fresh = app.state.log, LogWatch(app.state.cases.ledger)
        await forgotten.close()
        await fresh.open(app.state.cases.connection, app.state.cases.topology)
        app.state.log = fresh


async def run_cases(logged: Logged, n: int) -> list[str]:
    ids = []
    for i in range(n):
        reply = await logged.client.post("/cases", json={
            "agent": "loan-officer", "input": SAMPLE_APPLICATIONS[i % 3]})
        assert reply.status_code == 202, reply.text
        ids.append(reply.json()["caseId"])
    for case_id in ids:
        await ended(logged.client, case_id)
    return ids


async def logged_everything(logged: Logged) -> tuple[int, str]:
    """Wait until the latest checkpoint holds every stored event; its size and note."""
    async def check() -> tuple[int, str] | None:
        stored = await logged.pool.fetchval("SELECT count(*) FROM event_log")
        reply = await logged.client.get("/ledger/checkpoint")
        if reply.status_code != 200:
            return None
        head, _ = open_checkpoint(reply.text, logged.log_key)
        return (head.size, reply.text) if head.size == stored else None

    found: tuple[int, str] = await wait_until(check, timeout=30)
    return found


async def as_superuser(pool: asyncpg.Pool, *statements: str, args: Any = ()) -> None:
    """What an operator with the database's superuser can do: switch the append-only
    triggers off and drop the constraint that holds the log's columns to the signed
    bytes, change the record, put both back (the constraint NOT VALID)."""
    async with pool.acquire() as conn, conn.transaction():
        for table in ("event_log", "ledger_leaves", "ledger_tiles", "ledger_checkpoints"):
            await conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        async with without_body_constraint(conn):
            for statement in statements:
                await conn.execute(statement, *args) if args else await conn.execute(statement)
        for table in ("event_log", "ledger_leaves", "ledger_tiles", "ledger_checkpoints"):
            await conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


async def witness_once(logged: Logged, state: Path) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, component_command(
        "witness", "--log", logged.stack.base_url, "--log-key", logged.log_key.text(),
        "--state", str(state), "--once"),
        capture_output=True, text=True, env=logged.settings.environment(), timeout=60)


async def export(logged: Logged, case_id: str, path: Path) -> Path:
    reply = await logged.client.get(f"/cases/{case_id}/bundle")
    assert reply.status_code == 200
    await asyncio.to_thread(path.write_bytes, reply.content)
    return path


@asynccontextmanager
async def serving(own: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
                  pool: asyncpg.Pool, key: str, children: dict[str, subprocess.Popen[bytes]]
                  ) -> AsyncIterator[Logged]:
    """The in-process stack of ``own`` and its REST client, as the ledger tests use it."""
    async with in_process_stack(own, amqp, pool, worker_concurrency=4) as stack, \
            httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                              headers={"Authorization": f"Bearer {key}"}) as client:
        yield Logged(own, pool, stack, client, children, log_signer(own).verifier,
                     Path(os.devnull), log_signer(own).verifier, None)  # type: ignore[arg-type]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


async def back_up(own: Settings, backup: Path) -> None:
    """The namespace's database, as `pg_dump -Fc` keeps it."""
    await asyncio.to_thread(_run, "pg_dump", "-Fc", "-f", str(backup), own.database_url)


async def restore(own: Settings, pool: asyncpg.Pool, backup: Path) -> None:
    """The namespace's database brought back from ``backup``, as the runbook does; the
    tests' own pool forgets its connections to the tables replaced."""
    await asyncio.to_thread(_run, "pg_restore", "--clean", "--if-exists",
                            "--single-transaction", "-d", own.database_url, str(backup))
    await pool.expire_connections()


async def metric_shows(port: int, line: str) -> bool:
    try:
        async with httpx.AsyncClient() as client:
            return line in (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    except httpx.TransportError:
        return False


async def audit(own: Settings, *args: str) -> tuple[int, dict[str, Any]]:
    done = await asyncio.to_thread(
        subprocess.run, component_command("audit", "--json", *args), capture_output=True,
        text=True, env=own.environment(), timeout=120)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.returncode, orjson.loads(done.stdout.splitlines()[-1])


def found(report: dict[str, Any]) -> set[tuple[str, str | None]]:
    return {(f["kind"], f.get("caseId")) for f in report["findings"]}
