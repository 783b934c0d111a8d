"""The restore drill (docs/operations.md, "Backup and restore"): back up a namespace's
database with pg_dump, lose the Postgres cluster, restore onto a fresh cluster whose
roles `casetrail setup` makes again, and check the evidence end to end: every case
verifies, every bundle exported before verifies against the restored log (`--log`),
personal data reads back in clear, and the log goes on from where it was."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest

from casetrail.adapters.store import ApiKeyStore, create_pool
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.components.supervisor import component_command
from casetrail.config import Settings
from casetrail.ledger.log_key import log_signer
from casetrail.ledger.note import open_checkpoint
from casetrail.ops.setup import setup
from casetrail.trail.keyfile import worker_signer
from faults.conftest import Stack, running_stack
from tests.support.helpers import ended, wait_until
from tests.support.stack import free_port

pytestmark = pytest.mark.timeout(600)

VERSION = sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]


@contextmanager
def fresh_cluster(name: str) -> Iterator[int]:
    """A new, empty Postgres cluster of this machine's version (trust auth on
    loopback), dropped afterwards: what a lost database server is restored onto."""
    port = free_port()
    subprocess.run(["pg_createcluster", VERSION, name, "-p", str(port), "--",
                    "--auth-local=trust", "--auth-host=trust"], check=True,
                   capture_output=True, timeout=120)
    try:
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", VERSION, name,
                        "start"], check=True, timeout=120)
        yield port
    finally:
        subprocess.run(["pg_dropcluster", "--stop", VERSION, name], check=False,
                       capture_output=True, timeout=120)


async def _cases(stack: Stack, n: int) -> list[str]:
    async with httpx.AsyncClient(base_url=stack.base_url, headers=stack.headers,
                                 timeout=10) as client:
        ids = [(await client.post("/cases", json={
            "agent": "loan-officer", "input": SAMPLE_APPLICATIONS[i % 3]})).json()["caseId"]
            for i in range(n)]

        for case_id in ids:  # decided, or waiting for a person: the trail is written
            await ended(client, case_id, timeout=120)
    return ids


async def _logged(stack: Stack) -> int:
    """Wait until the log's checkpoint holds every stored event; its size."""
    pool = await create_pool(stack.settings.database_url, max_size=1)
    verifier = log_signer(stack.settings).verifier
    try:
        async def covered() -> int | None:
            stored = await pool.fetchval("SELECT count(*) FROM event_log")
            async with httpx.AsyncClient(base_url=stack.base_url) as client:
                reply = await client.get("/ledger/checkpoint")
            if reply.status_code != 200:
                return None
            size = open_checkpoint(reply.text, verifier)[0].size
            return size if size == stored else None

        found: int = await wait_until(covered, timeout=60, interval=0.3)
        return found
    finally:
        await pool.close()


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(component_command(*args), capture_output=True, text=True,
                          env=settings.environment(), timeout=120, check=False)


def _start(stack: Stack, port: int) -> None:
    stack.start("api", "api", "--port", str(port))
    stack.start("worker", "worker")
    stack.start("consumer", "consumer")
    stack.start("ledger", "ledger")
    stack.start("capability-worker", "capability-worker")


async def _stop(stack: Stack) -> None:
    for name in list(stack.children):
        child = stack.children.pop(name)
        child.terminate()
        await asyncio.to_thread(child.wait, 30)


async def test_a_namespace_restored_onto_a_fresh_cluster_verifies_end_to_end(
    tmp_path: Path,
) -> None:
    async with running_stack(tmp_path) as stack:
        ids = await _cases(stack, 4)
        size = await _logged(stack)
        bundles = {}
        async with httpx.AsyncClient(base_url=stack.base_url, headers=stack.headers) as c:
            for case_id in ids:
                bundles[case_id] = tmp_path / f"{case_id}.bundle.json"
                bundles[case_id].write_bytes((await c.get(f"/cases/{case_id}/bundle")).content)
        dump = tmp_path / "namespace.dump"
        await asyncio.to_thread(subprocess.run, ["pg_dump", "-Fc", "-f", str(dump),
                                stack.settings.database_url], check=True, timeout=120)
        await _stop(stack)
        original = stack.settings

        with fresh_cluster(f"drill{uuid.uuid4().hex[:6]}") as port:
            # The same namespace, its keys and secrets file, on a cluster that has none
            # of its roles: setup makes them (and the empty database), then the dump.
            url = original.database_url.replace(":5432/", f":{port}/")
            assert url != original.database_url
            restored = original.model_copy(update={"database_url": url})
            await setup(restored)
            await asyncio.to_thread(
                subprocess.run, ["pg_restore", "--clean", "--if-exists",
                                 "--single-transaction", "-d", url, str(dump)],
                check=True, timeout=120, capture_output=True)
            await setup(restored)  # after the dump: migrations, grants, nothing made anew
            stack.settings = restored
            api_port = free_port()
            stack.base_url = f"http://127.0.0.1:{api_port}"
            _start(stack, api_port)
            try:
                await wait_until(stack.ready, timeout=60, interval=0.2)
                await _check_restored(stack, ids, bundles, size)
            finally:
                await _stop(stack)
        stack.settings = original


async def _check_restored(stack: Stack, ids: list[str], bundles: dict[str, Path],
                          size: int) -> None:
    settings = stack.settings
    for case_id in ids:  # every case's trail, against the restored registry of keys
        verdict = await asyncio.to_thread(_cli, settings, "verify", case_id)
        assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    signer = worker_signer(settings)
    for path in bundles.values():  # bundles from before, against the restored log
        checked = await asyncio.to_thread(
            _cli, settings, "verify-bundle", str(path), "--trust",
            base64.b64encode(signer.public_key).decode(), "--trust-log",
            log_signer(settings).verifier.text(), "--log", stack.base_url)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    pool = await create_pool(settings.database_url, max_size=1)
    try:
        _, key = await ApiKeyStore(pool).create("default", ("cases:read", "pii:read"),
                                                "drill auditor")
    finally:
        await pool.close()
    async with httpx.AsyncClient(base_url=stack.base_url,
                                 headers={"Authorization": f"Bearer {key}"}) as auditor:
        view = (await auditor.get(f"/cases/{ids[0]}")).json()
    assert view["input"]["applicantName"] == SAMPLE_APPLICATIONS[0]["applicantName"]
    assert view["sensitive"]["shownInClear"]
    # The log goes on from where it was: a new case, a larger checkpoint that extends it.
    await _cases(stack, 1)
    assert await _logged(stack) > size
    audit = await asyncio.to_thread(_cli, settings, "audit", "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert orjson.loads(audit.stdout.splitlines()[-1])["clean"]
