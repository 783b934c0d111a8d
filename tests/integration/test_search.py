"""Case search (``GET /cases``) over real HTTP: filters, newest first, cursor pages,
tenant scope, clear 422s, and a plan that reads an index in order (no sort)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from bench.viewer import SEED_SQL
from casetrail.adapters.store import ApiKeyStore
from casetrail.adapters.store.search import CaseFilter, Cursor
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.cli.demo import AML_SAMPLE
from casetrail.config import Settings
from casetrail.ops.setup import remove, setup
from tests.support.helpers import ended
from tests.support.stack import InProcessStack, module_stack, other_namespace

stack = module_stack(worker_concurrency=8)


@pytest.fixture(scope="module")
async def tenant_client(stack: InProcessStack, pool: asyncpg.Pool
                        ) -> Any:
    """A tenant of its own, so the other modules' cases never appear in its results."""
    _, key = await ApiKeyStore(pool).create("searcher", ("cases:start", "cases:read"), "search")
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                                 headers={"Authorization": f"Bearer {key}"}) as http:
        yield http


@pytest.fixture(scope="module")
async def reviewer(stack: InProcessStack, pool: asyncpg.Pool) -> Any:
    """A person of the same tenant who reviews what waits for one."""
    _, key = await ApiKeyStore(pool).create("searcher", ("cases:review", "cases:read"),
                                            "search reviewer", None, "search-reviewer")
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                                 headers={"Authorization": f"Bearer {key}"}) as http:
        yield http


@pytest.fixture(scope="module")
async def cases(tenant_client: httpx.AsyncClient, reviewer: httpx.AsyncClient
                ) -> dict[str, dict[str, Any]]:
    """Three loans (approve, refer or decline) and one AML case, all ended, one after the
    other so their creation order is known; caseId -> its view."""
    made: dict[str, dict[str, Any]] = {}
    bodies = [{"agent": "loan-officer", "input": a} for a in SAMPLE_APPLICATIONS[:3]]
    bodies.append({"agent": "aml-screening", "input": AML_SAMPLE})
    for body in bodies:
        case_id = (await tenant_client.post("/cases", json=body)).json()["caseId"]
        made[case_id] = await ended(tenant_client, case_id)
        if made[case_id]["status"] == "awaiting_review":  # a refer, an escalation
            reply = await reviewer.post(f"/cases/{case_id}/review", json={
                "verdict": "confirm", "reason": "As the agent reasoned."})
            assert reply.status_code == 202, reply.text
            made[case_id] = await ended(tenant_client, case_id, statuses=("awaiting_review",))
    return made


async def search(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    reply = await client.get("/cases", params=params)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


async def test_search_lists_the_tenants_cases_newest_first_with_their_decisions(
    tenant_client: httpx.AsyncClient, cases: dict[str, dict[str, Any]],
) -> None:
    page = await search(tenant_client)
    assert [i["caseId"] for i in page["items"]] == list(reversed(cases))
    assert page["nextCursor"] is None
    for item in page["items"]:
        view = cases[item["caseId"]]
        assert item["decision"] == view["answer"]["decision"]
        assert item["status"] == "completed" and item["cycles"] == view["cycles"]
        assert item["startedBy"].startswith("key:")
        assert item["startedByName"] == "search"  # the key's name, not its id
        assert view["startedBy"] == item["startedBy"] and view["startedByName"] == "search"
        assert "input" not in item  # search results carry no case input


async def test_each_filter_narrows_the_results(
    tenant_client: httpx.AsyncClient, cases: dict[str, dict[str, Any]],
) -> None:
    loans = [c for c, v in cases.items() if v["agent"] == "loan-officer"]
    assert {i["caseId"] for i in (await search(tenant_client, agent="loan-officer"))["items"]
            } == set(loans)
    assert (await search(tenant_client, status="running"))["items"] == []
    assert len((await search(tenant_client, status="completed"))["items"]) == len(cases)
    decision = cases[loans[0]]["answer"]["decision"]
    found = (await search(tenant_client, decision=decision))["items"]
    assert found and {i["decision"] for i in found} == {decision}
    aml = (await search(tenant_client, agent="aml-screening"))["items"]
    assert len(aml) == 1
    # Time range: the last case's creation time splits the set.
    last = datetime.fromisoformat(aml[0]["createdAt"])
    after = (await search(tenant_client, since=last.isoformat()))["items"]
    before = (await search(tenant_client, until=last.isoformat()))["items"]
    assert [i["caseId"] for i in after] == [aml[0]["caseId"]]
    assert len(before) == len(cases) - 1
    assert (await search(tenant_client, decision=decision, status="running"))["items"] == []
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert (await search(tenant_client, since=future))["items"] == []


async def test_cursor_pages_cover_every_case_once(
    tenant_client: httpx.AsyncClient, cases: dict[str, dict[str, Any]],
) -> None:
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = await search(tenant_client, limit=1, **({"cursor": cursor} if cursor else {}))
        seen += [i["caseId"] for i in page["items"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == list(reversed(cases))


async def test_another_tenant_sees_none_of_them(
    client: httpx.AsyncClient, cases: dict[str, dict[str, Any]],
) -> None:
    shown = {i["caseId"] for i in (await search(client, limit=200))["items"]}
    assert not shown & set(cases)


@pytest.mark.parametrize(("params", "field"), [
    ({"cursor": "not-a-cursor"}, "cursor"),
    ({"since": "2026-01-01T00:00:00"}, "since"),  # no UTC offset: ambiguous
    ({"status": "done"}, "status"),
    ({"limit": 0}, "limit"),
    ({"limit": 201}, "limit"),
    ({"agent": "a\x00b"}, "agent"),
])
async def test_bad_search_parameters_get_a_422_naming_the_field(
    tenant_client: httpx.AsyncClient, params: dict[str, Any], field: str,
) -> None:
    reply = await tenant_client.get("/cases", params=params)
    assert reply.status_code == 422, reply.text
    assert ["query", field] in [d["loc"][:2] for d in reply.json()["errors"]]


def test_a_cursor_round_trips_to_the_microsecond() -> None:
    cursor = Cursor(datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC), uuid.uuid4())
    assert Cursor.decode(cursor.encode()) == cursor


@pytest.fixture(scope="module")
async def seeded(settings: Settings) -> AsyncIterator[Settings]:
    """A namespace of its own holding 200,000 seeded cases (the benchmark's mix), so the
    planner sees a table the size where the choice of index matters."""
    big = other_namespace(settings, "plans")
    await setup(big)
    try:
        conn = await asyncpg.connect(big.database_url)
        try:
            await conn.execute(SEED_SQL.replace("$1::int", "1").replace("$2::int", "200000"))
            await conn.execute("ANALYZE cases")
        finally:
            await conn.close()
        yield big
    finally:
        await remove(big)


@pytest.mark.parametrize(("wanted", "index"), [
    (CaseFilter("default"), "cases_search_recent"),
    (CaseFilter("default", since=datetime.now(UTC) - timedelta(days=2)), "cases_search_recent"),
    (CaseFilter("default", agent="aml-screening"), "cases_search_agent"),
    (CaseFilter("default", status="failed"), "cases_search_status"),
    (CaseFilter("default", decision="decline"), "cases_search_decision"),
    (CaseFilter("default", agent="aml-screening", decision="decline"),
     "cases_search_agent_decision"),
])
async def test_each_filter_is_an_ordered_index_scan_without_a_sort(
    seeded: Settings, wanted: CaseFilter, index: str,
) -> None:
    """The plan at 200,000 cases, as the API's own role (row-level security applies to
    it: a comparison that is not leakproof cannot be an index condition there): the
    filter's own index, read in order, and no Sort node however many cases match."""
    after = Cursor(datetime.now(UTC), uuid.uuid4())
    where, args = wanted.where(after)
    conn = await asyncpg.connect(seeded.identity("api").database_url)
    try:
        plan = "\n".join(r[0] for r in await conn.fetch(
            f"EXPLAIN SELECT case_id, status, decision FROM cases WHERE {where} "
            f"ORDER BY created_at DESC, case_id DESC LIMIT 51", *args))
    finally:
        await conn.close()
    assert index in plan, plan
    assert "Sort" not in plan, plan


async def test_the_search_and_the_quota_count_share_the_index(pool: asyncpg.Pool) -> None:
    # The superseded indexes are gone; the quota's recent count reads the search index.
    names = {r["indexname"] for r in await pool.fetch(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'cases'")}
    assert {"cases_search_recent", "cases_search_agent", "cases_search_status",
            "cases_search_decision", "cases_search_agent_decision"} <= names
    assert not {"cases_status", "cases_tenant_created"} & names
