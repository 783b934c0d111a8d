"""Finding a case by the identifier people have (an applicant id, a customer id), and
no query parameter ever silently ignored: real stack, real Postgres."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx

from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from tests.support.helpers import ended
from tests.support.records import SUSPECT, key_with
from tests.support.stack import InProcessStack, module_stack, serve_api

stack = module_stack(worker_concurrency=4)


async def started(client: httpx.AsyncClient, agent: str, case_input: dict[str, Any]) -> str:
    case_id: str = (await client.post("/cases", json={"agent": agent, "input": case_input})
                    ).json()["caseId"]
    await ended(client, case_id)
    return case_id


async def found(client: httpx.AsyncClient, **params: str) -> list[str]:
    reply = await client.get("/cases", params=params)
    assert reply.status_code == 200, reply.text
    return [item["caseId"] for item in reply.json()["items"]]


async def test_a_case_is_found_by_its_applicant_id_and_only_its_own(
    client: httpx.AsyncClient, pool: asyncpg.Pool, stack: InProcessStack,
) -> None:
    """In a tenant of its own (the suite's other modules start cases for the same sample
    applicants in the default tenant)."""
    tenant = f"keys-{uuid.uuid4().hex[:8]}"
    _, key = await ApiKeyStore(pool).create(tenant, ("cases:start", "cases:read"), "keys")
    async with httpx.AsyncClient(base_url=stack.base_url,
                                 headers={"Authorization": f"Bearer {key}"}) as own:
        maria = await started(own, "loan-officer", SAMPLE_APPLICATIONS[0])  # A-1001
        daniel = await started(own, "loan-officer", SAMPLE_APPLICATIONS[1])
        again = await started(own, "loan-officer", SAMPLE_APPLICATIONS[0])
        applicant = SAMPLE_APPLICATIONS[0]["applicantId"]
        assert await found(own, key=applicant) == [again, maria]  # newest first
        assert await found(own, **{"key.applicantId": applicant}) == [again, maria]
        assert daniel not in await found(own, key=applicant)
        assert await found(own, key="A-0000") == []
        assert await found(own, key=applicant, status="completed", limit="1") == [again]
    kept: Any = await pool.fetchrow("SELECT field, value, digest FROM case_keys "
                                    "WHERE case_id = $1", uuid.UUID(maria))
    assert dict(kept) == {"field": "applicantId", "value": applicant, "digest": False}
    # Another tenant searching the same applicant id sees none of these.
    assert not {maria, again} & set(await found(client, key=applicant))


async def test_a_sensitive_key_is_kept_as_a_digest_found_by_value_and_erased_with_the_case(
    client: httpx.AsyncClient, pool: asyncpg.Pool, stack: InProcessStack,
) -> None:
    case_id = await started(client, "aml-screening", SUSPECT)
    customer = str(SUSPECT["customerId"])
    kept: Any = await pool.fetchrow("SELECT value, digest FROM case_keys WHERE case_id = $1",
                               uuid.UUID(case_id))
    assert kept["digest"] is True and customer not in kept["value"]
    assert kept["value"].startswith("hmac:")
    auditor = await key_with(pool, "cases:read", "pii:read")
    async with httpx.AsyncClient(base_url=stack.base_url, headers=auditor) as reads_pii:
        assert case_id in await found(reads_pii, key=customer)
        assert case_id in await found(reads_pii, **{"key.customerId": customer})
    # Without pii:read the value is not searchable: the case view shows a placeholder,
    # and a search must not tell which case holds the value either.
    probe = await client.get("/cases", params={"key.customerId": customer})
    assert probe.status_code == 403, probe.text
    assert "key.customerId" in probe.json()["detail"] and "pii:read" in probe.text
    assert case_id not in await found(client, key=customer)
    admin = await key_with(pool, "admin")
    async with httpx.AsyncClient(base_url=stack.base_url, headers=admin) as operator:
        # The screening escalates: it waits for a person; withdrawn, it ends and is erased.
        assert (await ended(operator, case_id))["status"] == "awaiting_review"
        assert (await operator.post(f"/cases/{case_id}/cancel")).status_code == 202
        assert (await ended(operator, case_id, statuses=("awaiting_review",)))["status"] \
            == "cancelled"
        assert (await operator.post(f"/cases/{case_id}/erase")).status_code == 202
    assert await pool.fetchval("SELECT count(*) FROM case_keys WHERE case_id = $1",
                               uuid.UUID(case_id)) == 0
    assert case_id not in await found(client, key=customer)
    # A legal hold on the customer still reaches the erased case: its key's digest (never
    # the value) is kept for the holds alone.
    mark = await pool.fetchval("SELECT digest FROM case_key_marks WHERE case_id = $1",
                               uuid.UUID(case_id))
    assert mark == kept["value"] and customer not in mark
    holder = await key_with(pool, "holds:manage")
    async with httpx.AsyncClient(base_url=stack.base_url, headers=holder) as holds:
        # (ending soon by itself: the namespace is shared with the other test modules)
        placed = await holds.post("/holds", json={
            "scope": "business_key", "key": {"field": "customerId", "value": customer},
            "reason": "Matter 88-2026",
            "endsAt": (datetime.now(UTC) + timedelta(seconds=15)).isoformat()})
        assert placed.status_code == 201, placed.text
        assert placed.json()["key"]["value"] == mark  # kept as the digest
        keeping = (await holds.get("/holds", params={"caseId": case_id})).json()["holds"]
        assert [h["holdId"] for h in keeping] == [placed.json()["holdId"]]
    assert await pool.fetchval("SELECT case_held($1, 'default')", uuid.UUID(case_id))


async def test_an_unknown_query_parameter_is_a_422_naming_it_on_every_route(
    client: httpx.AsyncClient,
) -> None:
    """`GET /cases?applicantId=A-2002` used to answer every case."""
    case_id = await started(client, "loan-officer", SAMPLE_APPLICATIONS[2])
    for path, params, named in (
            ("/cases", {"applicantId": "A-2002"}, "applicantId"),
            ("/cases", {"key.nothing": "x"}, "key.nothing"),
            (f"/cases/{case_id}", {"verbose": "1"}, "verbose"),
            (f"/cases/{case_id}/events", {"type": "REACT_CYCLE"}, "type"),
            ("/agents", {"all": "1"}, "all"),
            ("/ledger/checkpoints", {"after": "3"}, "after")):
        reply = await client.get(path, params=params)
        assert reply.status_code == 422, (path, reply.text)
        assert ["query", named] in [e["loc"] for e in reply.json()["errors"]], path
    events = await client.get(f"/cases/{case_id}/events", params={"types": "CASE_STARTED"})
    assert events.status_code == 200  # a parameter the route reads itself is known


async def test_key_searches_count_against_the_tenants_limit(
    settings: Settings, stack: InProcessStack, client: httpx.AsyncClient,
) -> None:
    """An API allowing three key searches a minute: the fourth is a 429 with
    Retry-After, for a search by any key field; a search without a key is not counted."""
    strict = settings.model_copy(update={"tenant_max_key_searches_per_minute": 3})
    async with serve_api(strict) as base_url, httpx.AsyncClient(
            base_url=base_url, headers=client.headers) as limited:
        for value in ("A-1", "A-2", "A-3"):
            assert (await limited.get("/cases", params={"key": value})).status_code == 200
        over = await limited.get("/cases", params={"key.applicantId": "A-4"})
        assert over.status_code == 429, over.text
        assert 1 <= int(over.headers["Retry-After"]) <= 60
        assert (await limited.get("/cases", params={"agent": "loan-officer"})).status_code \
            == 200
