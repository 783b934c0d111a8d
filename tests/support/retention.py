"""What the retention tests share: a person's client, cases the agent decides on its own,
and a case's end moved into the past (the floor is six months: a test cannot wait)."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import httpx

from casetrail.adapters.store import ApiKeyStore, CaseStore, StoredEvent
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.components.retention import RetentionKeeper
from casetrail.components.worker import CaseWorker
from tests.support.helpers import ended


async def person(pool: asyncpg.Pool, base_url: str, who: str, *scopes: str
                 ) -> httpx.AsyncClient:
    _, key = await ApiKeyStore(pool).create("default", scopes, f"{who}'s key", person=who)
    return httpx.AsyncClient(base_url=base_url, timeout=10,
                             headers={"Authorization": f"Bearer {key}"})


async def decided(client: httpx.AsyncClient, n: int) -> list[str]:
    """``n`` loan cases the agent decides on its own (none waits for a review)."""
    ids = []
    for _ in range(n):
        reply = await client.post("/cases", json={"agent": "loan-officer",
                                                  "input": SAMPLE_APPLICATIONS[0]})
        assert reply.status_code == 202, reply.text
        ids.append(reply.json()["caseId"])
    for case_id in ids:
        assert (await ended(client, case_id))["status"] == "completed"
    return ids


async def backdate(pool: asyncpg.Pool, case_id: str, days: int) -> None:
    """As if the case had ended ``days`` ago (the floor is six months: a test cannot wait)."""
    await pool.execute("UPDATE cases SET ended_at = now() - make_interval(days => $2) "
                       "WHERE case_id = $1", uuid.UUID(case_id), days)


async def cast(pool: asyncpg.Pool, base_url: str) -> dict[str, httpx.AsyncClient]:
    """The people of the retention tests: alice and bob manage retention, carol and dave
    holds, and an operator's admin key; close them with ``aclose_all``."""
    clients = {who: await person(pool, base_url, who, scope) for who, scope in (
        ("alice", "retention:manage"), ("bob", "retention:manage"),
        ("carol", "holds:manage"), ("dave", "holds:manage"))}
    _, admin_key = await ApiKeyStore(pool).create("default", ["admin"], "operator")
    clients["admin"] = httpx.AsyncClient(base_url=base_url, timeout=10,
                                         headers={"Authorization": f"Bearer {admin_key}"})
    return clients


async def aclose_all(clients: dict[str, httpx.AsyncClient]) -> None:
    for client in clients.values():
        await client.aclose()


async def decided_samples(base_url: str, headers: dict[str, str], pool: asyncpg.Pool
                          ) -> dict[uuid.UUID, list[StoredEvent]]:
    """The three sample loan applications decided by the scripted loan officer (approve,
    refer: waiting for a person with the agent's decision, decline): case id → its
    stored events, once the terminal events reached Postgres."""
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10) as client:
        ids = []
        for application in SAMPLE_APPLICATIONS[:3]:
            reply = await client.post("/cases", json={"agent": "loan-officer",
                                                      "input": application})
            assert reply.status_code == 202
            ids.append(uuid.UUID(reply.json()["caseId"]))
        for case_id in ids:
            assert (await ended(client, case_id))["status"] in ("completed", "awaiting_review")
    await asyncio.sleep(0.3)  # the terminal events reach Postgres
    return await CaseStore(pool).trails(ids)


def keeper_of(worker: CaseWorker) -> RetentionKeeper:
    """The retention pass a running worker hosts."""
    keeper = worker.hosted["retention"]
    assert isinstance(keeper, RetentionKeeper)
    return keeper
