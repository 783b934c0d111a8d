"""What people read is what was signed, tried as an attacker would on the real stack
(docs/security.md, "Served values"): with one component's database password, the case
row's decision cannot be written, nor a stored payload other than its signed bytes, nor
a person's action removed; as the database owner, a rewritten decision is shown as not
the signed one wherever the case is read, and counted."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client import REGISTRY

from casetrail.adapters.store import ApiKeyStore, CaseStore, KeyRegistry, component_pool
from casetrail.adapters.store.audit_log import AuditStore
from casetrail.adapters.store.ledger import LedgerStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.audit.audit_runs import Auditor
from casetrail.audit.evidence import Evidence
from casetrail.audit.whole_log import WholeLog
from casetrail.config import Settings
from casetrail.trail.keyfile import action_signer
from casetrail.trail.person_actions import PersonAction, sign_action
from tests.support.helpers import ended
from tests.support.records import key_with
from tests.support.stack import module_stack

stack = module_stack(worker_concurrency=4)

APPROVED = SAMPLE_APPLICATIONS[0]  # A-1001: the agent approves it


def mismatches() -> float:
    return REGISTRY.get_sample_value("casetrail_projection_mismatches_total") or 0.0


async def approved_case(client: httpx.AsyncClient) -> uuid.UUID:
    reply = await client.post("/cases", json={"agent": "loan-officer", "input": APPROVED})
    assert reply.status_code == 202, reply.text
    case = await ended(client, reply.json()["caseId"])
    assert (case["status"], case["answer"]["decision"]) == ("completed", "approve"), case
    assert case["integrity"]["verified"] is True and "problems" not in case["integrity"]
    return uuid.UUID(case["caseId"])


async def as_role(settings: Settings, component: str, sql: str, *args: Any) -> Any:
    pool = await component_pool(settings.identity(component), 1)  # type: ignore[arg-type]
    try:
        return await pool.fetchval(sql, *args)
    finally:
        await pool.close()


@pytest.mark.parametrize("component", ["consumer", "worker", "api"])
async def test_no_component_rewrites_the_decision_everyone_is_shown(
    client: httpx.AsyncClient, settings: Settings, component: str,
) -> None:
    """The consumer held UPDATE on the case row's answer to fold events: now the owner's
    trigger folds them, and no component's role may write the served columns."""
    case_id = await approved_case(client)
    for statement in (
            "UPDATE cases SET answer = jsonb_set(answer, '{decision}', '\"refer\"') "
            "WHERE case_id = $1",
            "UPDATE cases SET status = 'failed' WHERE case_id = $1",
            "UPDATE cases SET outcome = '{}', cycles = 0 WHERE case_id = $1"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await as_role(settings, component, statement, case_id)
    assert (await client.get(f"/cases/{case_id}")).json()["answer"]["decision"] == "approve"


async def test_the_consumers_role_stores_no_payload_but_the_signed_one(
    client: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool,
) -> None:
    """The consumer's role inserts events; a row whose queried columns say other than its
    signed bytes (an approve restated as refer, or another case's type) is refused by the
    database itself, whoever inserts it."""
    case_id = await approved_case(client)
    stored = await pool.fetchrow(
        "SELECT * FROM event_log WHERE case_id = $1 AND event_type = 'CASE_COMPLETED'",
        case_id)
    assert stored is not None
    forged = {**dict(stored), "event_id": uuid.uuid4(), "seq": stored["seq"] + 1}
    columns = [c for c in forged if c != "recorded_at"]
    insert = (f"INSERT INTO event_log ({', '.join(columns)}) VALUES "
              f"({', '.join(f'${n}' for n in range(1, len(columns) + 1))})")
    payload = {**stored["payload"], "answer": {**stored["payload"]["answer"],
                                                "decision": "refer"}}
    consumer = await component_pool(settings.identity("consumer"), 1)
    try:
        for change in ({"payload": payload}, {"event_type": "CASE_FAILED"},
                       {"hash": "0" * 64}):
            row = {**forged, **change}
            with pytest.raises(asyncpg.CheckViolationError, match="event_log_restates_body"):
                await consumer.execute(insert, *(row[c] for c in columns))
    finally:
        await consumer.close()
    assert await pool.fetchval("SELECT count(*) FROM event_log WHERE case_id = $1",
                               case_id) == stored["seq"] + 1


async def test_the_owners_rewrite_of_a_decision_is_never_shown_as_genuine(
    client: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    """The owner (no keys) rewrites the decision and a total in the case row: every read
    that shows them (the case, its verdict, the A2A artifacts and the viewer take the
    same view) says it does not verify, names projection_mismatch, and counts it; the
    audit's trail check (Evidence) finds it too."""
    case_id = await approved_case(client)
    before = mismatches()
    await pool.execute("UPDATE cases SET answer = jsonb_set(answer, '{decision}', '\"refer\"'), "
                       "cycles = cycles + 1 WHERE case_id = $1", case_id)
    view = (await client.get(f"/cases/{case_id}")).json()
    assert view["answer"]["decision"] == "refer"  # as stored, but not as genuine:
    assert view["integrity"]["verified"] is False
    assert view["integrity"]["problems"] == ["projection_mismatch"]
    report = (await client.get(f"/cases/{case_id}/verify")).json()
    assert report["verified"] is False
    (problem,) = report["problems"]
    assert problem["code"] == "projection_mismatch"
    assert "answer" in problem["message"] and "cycles" in problem["message"]
    assert "refer" not in problem["message"]  # columns named, never values
    assert mismatches() >= before + 2
    verdict = await Evidence(CaseStore(pool), KeyRegistry(pool)).verify(case_id)
    assert verdict is not None and [p.code for p in verdict.problems] == ["projection_mismatch"]
    # Put back as signed, it verifies again.
    await pool.execute("UPDATE cases SET answer = jsonb_set(answer, '{decision}', "
                       "'\"approve\"'), cycles = cycles - 1 WHERE case_id = $1", case_id)
    assert (await client.get(f"/cases/{case_id}")).json()["integrity"]["verified"] is True


async def test_no_component_removes_a_persons_action(
    client: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool,
) -> None:
    """The worker held DELETE on case_actions to move refused actions out of a wait's
    way: a genuine pending review could vanish without a trace. Now it refuses an action
    only through the owner's function, which keeps the row, and nobody removes a kept
    refusal."""
    case_id = await approved_case(client)
    await pool.execute(
        "INSERT INTO case_actions (case_id, parked_attempt, kind, verdict, reason, reviewer, "
        "acted_at) VALUES ($1, 1, 'review', 'confirm', 'looks right', $2, now())",
        case_id, {"subject": "rita", "via": "key"})
    for component in ("worker", "api", "consumer"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await as_role(settings, component,
                          "DELETE FROM case_actions WHERE case_id = $1", case_id)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await as_role(settings, component, "INSERT INTO case_actions_refused (case_id, "
                          "parked_attempt, kind, acted_at, why, why_code) VALUES ($1, 1, "
                          "'review', now(), 'x', 'x')", case_id)
    assert await as_role(settings, "worker", "SELECT refuse_case_action($1, 1, $2, $3)",
                         case_id, "no action key signed it", "unsigned") is True
    kept = await pool.fetchrow("SELECT kind, reviewer, why, why_code FROM case_actions_refused "
                               "WHERE case_id = $1", case_id)
    assert kept is not None
    assert dict(kept) == {"kind": "review", "reviewer": {"subject": "rita", "via": "key"},
                          "why": "no action key signed it", "why_code": "unsigned"}
    for statement in ("DELETE FROM case_actions_refused WHERE case_id = $1",
                      "UPDATE case_actions_refused SET why = 'x' WHERE case_id = $1"):
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await pool.execute(statement, case_id)
    with pytest.raises(asyncpg.CheckViolationError):
        await as_role(settings, "worker", "SELECT refuse_case_action($1, 1, '', 'x')",
                      case_id)


async def test_personal_data_is_erased_only_through_the_record(
    client: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool,
) -> None:
    """No component's role runs the owner's erasure functions (the worker's could shred
    a case no policy covered; the API's, any case with any author). A person's erasure
    is signed, recorded by the worker, and the database shreds the values as it stores
    that CASE_ERASED, taking who and when from it; values erased without their event are
    an audit finding."""
    case_id = await approved_case(client)
    for component, call in (("worker", "erase_for_retention($1, 'retention:policy 1')"),
                            ("api", "erase_personal_data($1, 'someone')")):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await as_role(settings, component, f"SELECT {call}", case_id)
    assert await pool.fetchval("SELECT erased_at FROM case_secrets WHERE case_id = $1",
                               case_id) is None
    admin = await key_with(pool, "admin")
    erased = await client.post(f"/cases/{case_id}/erase", headers=admin)
    assert erased.status_code == 202 and erased.json()["status"] == "erased", erased.text
    event = await pool.fetchrow("SELECT payload FROM event_log WHERE case_id = $1 AND "
                                "event_type = 'CASE_ERASED'", case_id)
    assert event is not None
    secret = await pool.fetchrow("SELECT erased_at, erased_by, wrapped_key FROM case_secrets "
                                 "WHERE case_id = $1", case_id)
    assert secret is not None and secret["wrapped_key"] is None
    signed = event["payload"]["action"]["signed"]
    assert (signed["kind"], signed["caseId"]) == ("erase", str(case_id))
    assert secret["erased_by"] == event["payload"]["erasedBy"] == signed["by"]
    report = (await client.get(f"/cases/{case_id}/verify")).json()
    assert report["verified"] is True and not report.get("warnings"), report

    # As the owner: another case's values shredded with no CASE_ERASED behind them.
    other = await approved_case(client)
    assert other not in await AuditStore(pool).erasures_unrecorded()
    await pool.execute("SELECT erase_personal_data($1, 'owner')", other)
    assert other in await AuditStore(pool).erasures_unrecorded()


async def test_a_business_key_names_only_its_own_case(
    client: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool,
) -> None:
    """With the API's database password alone, pointing an applicant's id at another
    (older) case is refused: a key is kept only with the case that the same transaction
    made, for the value its input holds."""
    victim = await approved_case(client)
    # (Its own applicantId is kept already: the primary key refuses a second.) Another
    # agent's key field, in clear or as a digest, on this older case:
    for digest in (False, True):
        with pytest.raises(asyncpg.CheckViolationError, match="only with the case it names"):
            await as_role(settings, "api", "INSERT INTO case_keys (case_id, tenant_id, field, "
                          "value, digest, created_at) VALUES ($1, 'default', 'customerId', "
                          "'C-4711', $2, now())", victim, digest)
    found = (await client.get("/cases", params={"key.applicantId": "A-1001"})).json()["items"]
    assert str(victim) in {c["caseId"] for c in found}
    # A case row the same transaction makes takes only its own input's value.
    api = await component_pool(settings.identity("api"), 1)
    try:
        with pytest.raises(asyncpg.CheckViolationError, match="only with the case it names"):
            async with api.acquire() as conn, conn.transaction():
                made = await conn.fetchval(
                    "INSERT INTO cases (case_id, agent, input, model, limits, request_digest) "
                    "VALUES (gen_random_uuid(), 'loan-officer', '{\"applicantId\": \"A-7\"}', "
                    "'{}', '{}', 'd') RETURNING case_id")
                await conn.execute("INSERT INTO case_keys (case_id, tenant_id, field, value, "
                                   "digest, created_at) VALUES ($1, 'default', 'applicantId', "
                                   "'A-1001', false, now())", made)
    finally:
        await api.close()


async def test_only_a_person_sets_a_retention_policy(
    client: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    """A service key set a policy and one person approved it: two "persons", one of them
    nobody. A service key is now refused, naming why."""
    service = await key_with(pool, "retention:manage")
    reply = await client.put("/retention/policies/*", headers=service,
                             json={"keepDays": 400, "reason": "by a script"})
    assert reply.status_code == 403 and "a person sets" in reply.text, reply.text


async def test_the_audit_names_a_refusal_of_a_valid_persons_action(
    stack: Any, settings: Settings, pool: asyncpg.Pool,
) -> None:
    """The worker's role can still refuse an action (through the owner's function, which
    keeps it): a genuine, signed, rule-keeping review refused that way is found by the
    audit, which judges every refusal again by the worker's own rule; a forged one that
    was refused rightly is not."""
    store = ApiKeyStore(pool)
    _, sam = await store.create("served", ("cases:start", "cases:read"), None, None, "sam")
    cases = []
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                                 headers={"Authorization": f"Bearer {sam}"}) as client:
        for _ in range(2):
            reply = await client.post("/cases", json={"agent": "loan-officer",
                                                      "input": SAMPLE_APPLICATIONS[1]})
            assert reply.status_code == 202, reply.text
            case = await ended(client, reply.json()["caseId"], timeout=30)
            assert case["status"] == "awaiting_review", case
            cases.append(uuid.UUID(case["caseId"]))
    genuine, forged = cases
    for case_id, signed in ((genuine, True), (forged, False)):
        attempt = await pool.fetchval("SELECT parked_attempt FROM cases WHERE case_id = $1",
                                      case_id)
        when, reviewer = datetime.now(UTC), {"subject": "rita", "via": "oidc"}
        action = sign_action(action_signer(settings), PersonAction(
            case_id, "served", attempt, "review", "review", when, person=reviewer,
            verdict="confirm", reason="Referred rightly: income unverified."))
        await pool.execute(
            "INSERT INTO case_actions (case_id, parked_attempt, kind, verdict, reason, "
            "reviewer, acted_at, signed, key_id, sig) VALUES ($1, $2, 'review', 'confirm', "
            "$3, $4, $5, $6, $7, $8)", case_id, attempt,
            "Referred rightly: income unverified.", reviewer, when,
            action.signed if signed else None, action.key_id if signed else None,
            action.sig if signed else None)
        assert await as_role(settings, "worker", "SELECT refuse_case_action($1, $2, $3, $4)",
                             case_id, attempt, "the starter reviews",
                             "four_eyes" if signed else "unsigned") is True
    ledger = LedgerStore(pool)
    report = await WholeLog(AuditStore(pool), ledger,
                            Evidence(CaseStore(pool), KeyRegistry(pool), ledger),
                            Auditor.of(settings)).run()
    named = {f.case_id for f in report.findings if f.kind.value == "refused_valid_action"}
    assert genuine in named and forged not in named, report.as_json()
