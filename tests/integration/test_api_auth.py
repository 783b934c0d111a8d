"""Who may do what (real uvicorn, real Postgres, real broker): every route states its
caller, keys are checked on every request, scopes are enforced, and a tenant never
sees another's case."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.api import create_app
from casetrail.api.routes import api_routes
from casetrail.config import Settings
from casetrail.ops.setup import rabbitmqctl_environment
from tests.support.helpers import ended
from tests.support.stack import InProcessStack, module_stack, serve_api

PUBLIC = {"/healthz", "/readyz", "/signing-keys", "/asyncapi.json", "/ui/", "/ui/cases/{case_id}",
          "/ui/reviews", "/ui/backtests", "/ui/backtests/{backtest_id}", "/ui/assets/{name}",
          "/ledger/checkpoint", "/ledger/checkpoints",
          "/ledger/key", "/ledger/proofs/inclusion", "/ledger/proofs/consistency",
          "/ledger/cosignatures", "/ledger/leaves/{event_hash}/proof", "/docs",
          "/docs/assets/{name}", "/.well-known/agent-card.json",
          "/a2a/{agent}/.well-known/agent-card.json"}
"""The public routes (docs/design.md, "Trust"); FastAPI's own /openapi.json too."""
LOAN = {"agent": "loan-officer", "input": SAMPLE_APPLICATIONS[2]}


stack = module_stack(worker_concurrency=4)


async def key(pool: asyncpg.Pool, tenant: str, *scopes: str,
              expires_at: datetime | None = None) -> tuple[str, dict[str, str]]:
    key_id, secret = await ApiKeyStore(pool).create(tenant, scopes, "auth test", expires_at)
    return key_id, {"Authorization": f"Bearer {secret}"}


def test_every_route_states_its_caller_and_only_the_designed_ones_are_public(
    settings: Settings,
) -> None:
    app = create_app(settings)
    callers: dict[str, tuple[str, ...]] = {}
    for route in api_routes(app.routes):  # (FastAPI's own /openapi.json: public by design)
        stated: list[tuple[str, ...]] = [
            who for d in route.dependant.dependencies
            if (who := getattr(d.call, "casetrail_caller", None))]
        assert len(stated) == 1, f"{route.path} {route.methods} states no caller"
        callers[f"{sorted(route.methods or ())[0]} {route.path}"] = stated[0]
    public = {path.split(" ", 1)[1] for path, who in callers.items() if who == ("public",)}
    assert public == PUBLIC
    assert callers["POST /cases"] == ("cases:start",)
    assert callers["GET /cases/{case_id}"] == ("cases:read",)
    assert callers["POST /cases/{case_id}/cancel"] == ("cases:cancel",)
    document = app.openapi()
    assert document["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"


async def test_without_a_valid_key_every_private_route_answers_401(
    stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    revoked_id, revoked = await key(pool, "default", "cases:read")
    assert await ApiKeyStore(pool).revoke(revoked_id)
    _, expired = await key(pool, "default", "cases:read",
                           expires_at=datetime.now(UTC) - timedelta(seconds=1))
    async with httpx.AsyncClient(base_url=stack.base_url) as http:
        for headers in ({}, {"Authorization": "Bearer nonsense"},
                        {"Authorization": "Basic dXNlcjpwYXNz"}, revoked, expired,
                        {"Authorization": "Bearer ct_000000000000_" + "A" * 43}):
            for method, path in (("GET", f"/cases/{uuid.uuid4()}"), ("POST", "/cases"),
                                 ("GET", "/agents"), ("GET", "/me")):
                reply = await http.request(method, path, headers=headers, json=LOAN)
                assert reply.status_code == 401, (headers, path, reply.text)
                assert reply.headers["www-authenticate"] == "Bearer"
        for route in PUBLIC:
            asset = "swagger-ui.css" if route.startswith("/docs/") else "app.js"
            path = route.replace("{case_id}", str(uuid.uuid4())).replace("{name}", asset) \
                .replace("{backtest_id}", str(uuid.uuid4())) \
                .replace("{agent}", "loan-officer") \
                .replace("{event_id}", str(uuid.uuid4())).replace("{event_hash}", "0" * 64)
            method = "POST" if route == "/ledger/cosignatures" else "GET"
            reply = await http.request(method, path)
            if route.startswith("/ledger/"):  # no ledger runs here: open, with nothing yet
                assert reply.status_code in (200, 404, 422), (route, reply.text)
            else:
                assert reply.status_code == 200, (route, reply.text)


async def test_a_caller_can_ask_who_its_credentials_act_as(
    stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    key_id, headers = await key(pool, "acme", "cases:read", "cases:start")
    _, admin = await key(pool, "globex", "admin")
    async with httpx.AsyncClient(base_url=stack.base_url) as http:
        assert (await http.get("/me", headers=headers)).json() == {
            "tenant": "acme", "subject": f"key:{key_id}",
            "scopes": ["cases:read", "cases:start"]}
        assert (await http.get("/me", headers=admin)).json()["scopes"] == ["admin"]


async def test_revocation_takes_effect_within_a_second(
    stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    key_id, headers = await key(pool, "default", "cases:read")
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers) as http:
        assert (await http.get("/agents")).status_code == 200
        assert await ApiKeyStore(pool).revoke(key_id)
        await asyncio.sleep(1.1)
        assert (await http.get("/agents")).status_code == 401


async def test_scopes_are_enforced_and_named(
    stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    _, reader = await key(pool, "default", "cases:read")
    _, starter = await key(pool, "default", "cases:start")
    async with httpx.AsyncClient(base_url=stack.base_url) as http:
        refused = await http.post("/cases", json=LOAN, headers=reader)
        assert refused.status_code == 403 and "cases:start" in refused.json()["detail"]
        override = await http.post("/cases", headers=starter, json={
            **LOAN, "model": {"provider": "scripted", "name": "lending-policy"}})
        assert override.status_code == 403 and "models:override" in override.json()["detail"]
        accepted = await http.post("/cases", json=LOAN, headers=starter)
        assert accepted.status_code == 202
        case_id = accepted.json()["caseId"]
        cancel = await http.post(f"/cases/{case_id}/cancel", headers=reader)
        assert cancel.status_code == 403 and "cases:cancel" in cancel.json()["detail"]


async def test_a_tenant_never_sees_another_tenants_case(
    stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    scopes = ("cases:start", "cases:read", "cases:cancel")
    a_id, tenant_a = await key(pool, "acme", *scopes)
    _, tenant_b = await key(pool, "globex", *scopes)
    async with httpx.AsyncClient(base_url=stack.base_url) as http:
        started = await http.post("/cases", json=LOAN,
                                  headers={**tenant_a, "Idempotency-Key": "loan-7"})
        assert started.status_code == 202
        case_id = started.json()["caseId"]
        other = await http.post("/cases", json=LOAN,
                                headers={**tenant_b, "Idempotency-Key": "loan-7"})
        assert other.status_code == 202 and other.json()["caseId"] != case_id
        for method, path in (("GET", ""), ("GET", "/events"), ("GET", "/verify"),
                             ("GET", "/bundle"), ("POST", "/cancel")):
            reply = await http.request(method, f"/cases/{case_id}{path}", headers=tenant_b)
            assert reply.status_code == 404, (path, reply.text)
        http.headers.update(tenant_a)
        case = await ended(http, case_id)
        trail = (await http.get(f"/cases/{case_id}/events")).json()["events"]
    assert case["answer"]["decision"] == "decline"
    assert {e["tenantId"] for e in trail} == {"acme"}
    assert trail[0]["payload"]["startedBy"] == f"key:{a_id}"
    assert await pool.fetchval("SELECT tenant_id FROM cases WHERE case_id = $1",
                               uuid.UUID(case_id)) == "acme"


async def test_who_cancelled_a_case_is_in_its_trail(
    client: httpx.AsyncClient, pool: asyncpg.Pool, api_key: str,
) -> None:
    slow = {**LOAN, "model": {"provider": "scripted", "name": "slow", "latencyMs": 1500}}
    case_id = (await client.post("/cases", json=slow)).json()["caseId"]
    await asyncio.sleep(0.3)
    assert (await client.post(f"/cases/{case_id}/cancel", json={"reason": "withdrawn"})
            ).status_code == 202
    case = await ended(client, case_id)
    assert case["status"] == "cancelled"
    terminal = (await client.get(f"/cases/{case_id}/events")).json()["events"][-1]
    key_id = api_key.split("_")[1]
    assert terminal["payload"]["cancelledBy"] == f"key:{key_id}"


async def test_bench_only_features_are_refused_outside_bench_mode(
    settings: Settings, stack: InProcessStack, auth_headers: dict[str, str],
) -> None:
    production = settings.model_copy(update={"bench_mode": False})
    async with serve_api(production) as base_url, \
            httpx.AsyncClient(base_url=base_url, headers=auth_headers) as http:
        probe = await http.post("/cases", json={"agent": "throughput-probe",
                                                "input": {"cycles": 2}})
        assert probe.status_code == 422 and "benchmarks" in probe.text
        slow = await http.post("/cases", json={
            **LOAN, "model": {"provider": "scripted", "name": "s", "latencyMs": 100}})
        assert slow.status_code == 422 and "latencyMs" in slow.text
        names = {a["name"] for a in (await http.get("/agents")).json()["agents"]}
        assert "throughput-probe" not in names and "loan-officer" in names
        document = (await http.get("/openapi.json")).json()
        assert "ThroughputProbeCaseRequest" not in document["components"]["schemas"]


def run_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "casetrail.cli", *args], capture_output=True,
                          text=True, env=settings.environment(), timeout=60, check=False)


async def test_keys_are_shown_once_listed_without_the_secret_and_revocable(
    settings: Settings, stack: InProcessStack,
) -> None:
    made = await asyncio.to_thread(run_cli, settings, "keys", "create", "--tenant", "initech",
                                   "--scopes", "cases:read", "--name", "auditor")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("ct_") and "\n" not in secret
    key_id = secret.split("_")[1]
    listed = await asyncio.to_thread(run_cli, settings, "keys", "list")
    line = next(x for x in listed.stdout.splitlines() if x.startswith(key_id))
    assert "initech" in line and "auditor" in line and secret not in listed.stdout
    bad = await asyncio.gather(
        asyncio.to_thread(run_cli, settings, "keys", "create", "--tenant", "Bad Tenant",
                          "--scopes", "cases:read"),
        asyncio.to_thread(run_cli, settings, "keys", "create", "--tenant", "ok",
                          "--scopes", "cases:everything"))
    assert [b.returncode for b in bad] == [2, 2]
    async with httpx.AsyncClient(base_url=stack.base_url,
                                 headers={"Authorization": f"Bearer {secret}"}) as http:
        assert (await http.get("/agents")).status_code == 200
        revoked = await asyncio.to_thread(run_cli, settings, "keys", "revoke", key_id)
        assert revoked.returncode == 0
        await asyncio.sleep(1.1)
        assert (await http.get("/agents")).status_code == 401


async def test_a_tenants_sql_role_sees_only_its_rows_in_tables_and_views(
    settings: Settings, stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    """Two tenants' cases run; each tenant's reader role (``casetrail sql-role create``)
    queries event_log, cases and the views (case_decisions too) and sees its own rows
    only."""
    scopes = ("cases:start", "cases:read")
    tenants = {"umbrella": await key(pool, "umbrella", *scopes),
               "hooli": await key(pool, "hooli", *scopes)}
    cases: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=stack.base_url) as http:
        for tenant, (_, headers) in tenants.items():
            http.headers.update(headers)
            cases[tenant] = (await http.post("/cases", json=LOAN)).json()["caseId"]
            await ended(http, cases[tenant])
    urls: dict[str, str] = {}
    try:
        for tenant in tenants:
            made = await asyncio.to_thread(run_cli, settings, "sql-role", "create",
                                           "--tenant", tenant)
            assert made.returncode == 0, made.stderr
            urls[tenant] = made.stdout.strip()
        for tenant, url in urls.items():
            conn = await asyncpg.connect(url)
            try:
                seen = {
                    table: {str(r[0]) for r in await conn.fetch(
                        f"SELECT DISTINCT case_id FROM {table}")}
                    for table in ("event_log", "cases", "react_cycles", "react_tool_calls",
                                  "case_decisions")}
                decided = await conn.fetchrow(
                    "SELECT agent, decision, decided_by, checks_passed, checks_failed "
                    "FROM case_decisions")
                tenants_seen = {r[0] for r in await conn.fetch(
                    "SELECT DISTINCT tenant_id FROM event_log")}
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute("DELETE FROM event_log")
            finally:
                await conn.close()
            assert tenants_seen == {tenant}
            assert decided is not None and dict(decided) == {
                "agent": "loan-officer", "decision": "decline", "decided_by": "agent",
                "checks_passed": 3, "checks_failed": 0}
            for table, ids in seen.items():
                assert ids == {cases[tenant]}, (tenant, table, ids)
    finally:
        for tenant in tenants:
            await asyncio.to_thread(run_cli, settings, "sql-role", "drop", "--tenant", tenant)
    assert not await pool.fetchval(
        "SELECT count(*) FROM pg_roles WHERE rolname LIKE '%_reader_umbrella'")


async def test_a_tenant_over_its_quota_gets_429_and_nothing_is_kept(
    stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    slow = {**LOAN, "model": {"provider": "scripted", "name": "slow", "latencyMs": 1500}}
    scopes = ("cases:start", "cases:read", "models:override")
    _, tiny = await key(pool, "tiny", *scopes)
    _, hasty = await key(pool, "hasty", *scopes)
    async with httpx.AsyncClient(base_url=stack.base_url) as http:
        assert (await http.post("/cases", json=slow, headers=tiny)).status_code == 202
        busy = await http.post("/cases", json=slow, headers=tiny)
        assert busy.status_code == 429 and "queued or running" in busy.json()["detail"]
        assert int(busy.headers["retry-after"]) > 0
        for _ in range(2):
            assert (await http.post("/cases", json=LOAN, headers=hasty)).status_code == 202
        fast = await http.post("/cases", json=LOAN, headers=hasty)
        assert fast.status_code == 429 and "last minute" in fast.json()["detail"]
        assert 1 <= int(fast.headers["retry-after"]) <= 60
    counts = {r["tenant_id"]: r["count"] for r in await pool.fetch(
        "SELECT tenant_id, count(*) FROM cases WHERE tenant_id IN ('tiny', 'hasty') "
        "GROUP BY tenant_id")}
    assert counts == {"tiny": 1, "hasty": 2}


async def test_a_full_start_queue_is_503_with_retry_after_and_nothing_is_kept(
    client: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool,
) -> None:
    """The operator bounds the start queue with a RabbitMQ policy (max-length,
    reject-publish): when it is full the broker nacks, and the API answers 503 and
    forgets the case."""
    name = f"{settings.namespace}-start-limit"
    queue = f"^{settings.namespace}\\.case-start$".replace("-", "\\-")
    policy = ["rabbitmqctl", "-q", "set_policy", name, queue,
              '{"max-length": 0, "overflow": "reject-publish"}', "--apply-to", "queues",
              "--priority", "10"]  # above the one `casetrail setup` set
    before = await pool.fetchval("SELECT count(*) FROM cases")
    await asyncio.to_thread(subprocess.run, policy, check=True, capture_output=True,
                            env=rabbitmqctl_environment())
    accepted: list[str] = []
    slow = {**LOAN, "model": {"provider": "scripted", "name": "slow", "latencyMs": 3000}}
    try:
        for _ in range(50):
            reply = await client.post("/cases", json=slow)
            if reply.status_code != 202:
                break
            accepted.append(reply.json()["caseId"])  # the queue is not full yet
            await asyncio.sleep(0.1)
        assert reply.status_code == 503, reply.text
        assert reply.headers["retry-after"] == "5"
        assert "nothing was kept" in reply.json()["detail"]
        kept = await pool.fetchval("SELECT count(*) FROM cases") - before
    finally:
        await asyncio.to_thread(subprocess.run, ["rabbitmqctl", "-q", "clear_policy", name],
                                check=True, capture_output=True,
                                env=rabbitmqctl_environment())
        for case_id in accepted:  # slow cases: stop them rather than leave them running
            await client.post(f"/cases/{case_id}/cancel")
    assert kept == len(accepted)  # the refused case left no row
