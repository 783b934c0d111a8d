"""Retention and legal holds on the real stack (worker, consumer, ledger, API, real
Postgres and RabbitMQ): a policy set by one person and approved by another; cases past
their time expire with a signed CASE_EXPIRED and a tombstone that verify and the audit
accept; personal data erased on its earlier deadline; held cases untouched, the
database itself refusing to expire or erase them; a hand deletion still found."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson
import pytest
from prometheus_client import REGISTRY

from casetrail.adapters.store import component_pool
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from tests.support.cli import run_cli
from tests.support.helpers import wait_for_sql
from tests.support.logged import as_superuser, audit, found, logged_everything, serving
from tests.support.retention import aclose_all, backdate, cast, decided, keeper_of, person
from tests.support.stack import kill_leftovers, namespace_of_its_own


async def stored_types(pool: asyncpg.Pool, case_id: str) -> list[str]:
    rows = await pool.fetch("SELECT event_type FROM event_log WHERE case_id = $1 "
                            "ORDER BY attempt, seq", uuid.UUID(case_id))
    return [r["event_type"] for r in rows]


async def test_a_policy_expires_cases_with_proof_and_holds_keep_theirs(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "retention") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                await _expire_hold_and_audit(own, pool, logged, logged.stack.base_url)
        finally:
            kill_leftovers(children)


async def _expire_hold_and_audit(own: Settings, pool: asyncpg.Pool, logged: Any,
                                 base_url: str) -> None:
    await logged.start_ledger()
    people = await cast(pool, base_url)
    alice, bob, carol, dave, admin = (people[w] for w in ("alice", "bob", "carol", "dave",
                                                           "admin"))
    cases = await decided(logged.client, 4)
    keeper = keeper_of(logged.stack.worker)
    try:
        policy = await _two_persons_set_a_policy(pool, alice, bob, keeper)
        hold = await _expire_and_erase(pool, logged, cases, policy, alice, carol, admin,
                                       keeper)
        await _the_database_refuses(own, pool, cases)
        await _the_audit_tells_expiry_from_deletion(own, pool, cases)
        await _two_persons_release(hold, carol, dave, cases)
        # The released hold ends on the case's trail too; the trail still verifies.
        assert (await keeper.pass_once()).holds_recorded == 1
        await wait_for_sql(pool, "SELECT count(*) FROM event_log WHERE case_id = $1 AND "
                           "event_type = 'CASE_RELEASED'", uuid.UUID(cases[1]))
        released = await pool.fetchval(
            "SELECT payload FROM event_log WHERE case_id = $1 AND event_type = "
            "'CASE_RELEASED'", uuid.UUID(cases[1]))
        assert released["releasedBy"] == ["carol", "dave"], released
        verdict = (await admin.get(f"/cases/{cases[1]}/verify")).json()
        assert verdict["verified"] is True, verdict
        await _from_the_command_line(own, cases)
    finally:
        await aclose_all(people)


async def _two_persons_set_a_policy(pool: asyncpg.Pool, alice: httpx.AsyncClient,
                                    bob: httpx.AsyncClient, keeper: Any) -> dict[str, Any]:
    # The default keeps everything: a pass does nothing at all.
    assert (await keeper.pass_once()).expiries_appended == 0
    assert (await alice.get("/retention/policies")).json()["policies"] == []
    # Below the floor is refused, by the API and by the database.
    low = await alice.put("/retention/policies/*", json={"keepDays": 30, "reason": "x"})
    assert low.status_code == 422 and "183" in low.text, low.text
    with pytest.raises(asyncpg.CheckViolationError, match="at least 183 days"):
        await pool.execute("INSERT INTO retention_policies (tenant_id, version, keep_days, "
                           "reason, set_by) VALUES ('default', 9, 30, 'x', 'owner')")
    # Deleting where everything was kept takes two persons.
    set_ = await alice.put("/retention/policies/*", json={
        "preset": "ai-act-minimum", "personalDataDays": 30,
        "reason": "Loan decisions: the AI Act's minimum; personal data a month."})
    assert set_.status_code == 201, set_.text
    policy: dict[str, Any] = set_.json()
    assert policy["needsSecondPerson"] is True and policy["inForce"] is False
    assert (await keeper.pass_once()).expiries_appended == 0  # not in force yet
    own_approval = await alice.post(f"/retention/policies/{policy['policyId']}/approve")
    assert own_approval.status_code == 403, own_approval.text
    approved = await bob.post(f"/retention/policies/{policy['policyId']}/approve")
    assert approved.status_code == 200 and approved.json()["approvedBy"] == "bob"
    return policy


async def _expire_and_erase(pool: asyncpg.Pool, logged: Any, cases: list[str],
                            policy: dict[str, Any], alice: httpx.AsyncClient,
                            carol: httpx.AsyncClient, admin: httpx.AsyncClient, keeper: Any
                            ) -> dict[str, Any]:
    expired, held, erased, late_held = cases
    for case_id, days in ((expired, 200), (held, 200), (erased, 40), (late_held, 200)):
        await backdate(pool, case_id, days)
    hold = await carol.post("/holds", json={"scope": "case", "caseId": held,
                                            "reason": "Complaint 2026-114"})
    assert hold.status_code == 201, hold.text
    planned = (await alice.get("/retention/plan")).json()
    by_case = {c["caseId"]: c for c in planned["cases"]}
    assert by_case[held]["held"] is True and by_case[expired]["held"] is False
    assert by_case[erased]["expiresAt"] > by_case[erased]["personalDataUntil"]
    refused = await admin.post(f"/cases/{held}/erase")
    assert refused.status_code == 409 and "legal hold" in refused.text, refused.text

    # First pass: personal data past its deadline erased (all but the held case's);
    # second pass: CASE_EXPIRED appended to the cases past their time but the held one.
    first = await keeper.pass_once()
    assert (first.expiries_appended, first.erased, first.held) == (0, 3, 1), first
    assert first.holds_recorded == 1  # the held case's trail says so, signed
    for case_id in (expired, erased, late_held):
        await wait_for_sql(pool, "SELECT count(*) FROM event_log WHERE case_id = $1 AND "
                           "event_type = 'CASE_ERASED'", uuid.UUID(case_id))
    second = await keeper.pass_once()
    assert (second.expiries_appended, second.erased, second.held) == (2, 0, 1), second
    for case_id in (expired, late_held):
        await wait_for_sql(pool, "SELECT count(*) FROM case_tombstones WHERE case_id = $1",
                           uuid.UUID(case_id))
    late = await carol.post("/holds", json={"scope": "case", "caseId": late_held,
                                            "reason": "Subpoena 77"})
    assert late.status_code == 201
    await logged_everything(logged)

    # Third pass: the tombstoned, unheld case's events go; the held one's stay.
    third = await keeper.pass_once()
    assert third.expired == 1 and third.events_removed > 3, third
    assert await stored_types(pool, expired) == ["CASE_EXPIRED"]
    assert await pool.fetchval("SELECT count(*) FROM cases WHERE case_id = $1",
                               uuid.UUID(expired)) == 0
    assert (await stored_types(pool, late_held))[-1] == "CASE_EXPIRED"
    assert (await stored_types(pool, held))[-1] == "CASE_HELD"
    verdict = (await admin.get(f"/cases/{expired}/verify")).json()
    assert verdict["verified"] is True and verdict["expired"]["policyId"] == \
        policy["policyId"], verdict
    # Reading it says it expired, and how (not "no case"); what remains is verifiable.
    for path in ("", "/events", "/bundle"):
        gone = await admin.get(f"/cases/{expired}{path}")
        assert gone.status_code == 410, (path, gone.text)
        assert f"under retention policy {policy['policyId']} version 1" in \
            gone.json()["detail"] and "/verify" in gone.json()["detail"]
    erasure = await pool.fetchval("SELECT payload ->> 'erasedBy' FROM event_log WHERE "
                                  "case_id = $1 AND event_type = 'CASE_ERASED'",
                                  uuid.UUID(erased))
    assert erasure == f"retention:policy-{policy['policyId']}-v1"
    kept: dict[str, Any] = hold.json()
    return kept


async def _the_database_refuses(own: Settings, pool: asyncpg.Pool, cases: list[str]) -> None:
    """Whoever asks: the worker's role, for a held or un-tombstoned case; the owner."""
    _, held, _, late_held = cases
    worker = await component_pool(own.identity("worker"), 1)
    try:
        with pytest.raises(asyncpg.PostgresError, match="legal hold"):
            await worker.fetchval("SELECT expire_case($1)", uuid.UUID(late_held))
        with pytest.raises(asyncpg.PostgresError, match="no tombstone"):
            await worker.fetchval("SELECT expire_case($1)", uuid.UUID(held))
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await worker.execute("DELETE FROM event_log WHERE case_id = $1", uuid.UUID(held))
    finally:
        await worker.close()
    with pytest.raises(asyncpg.RaiseError, match="append-only"):
        await pool.execute("DELETE FROM event_log WHERE case_id = $1", uuid.UUID(held))


async def _the_audit_tells_expiry_from_deletion(own: Settings, pool: asyncpg.Pool,
                                                cases: list[str]) -> None:
    expired, _, erased, _ = cases
    code, report = await audit(own, "--full")
    assert code == 0 and report["casesExpired"] == 1, report
    await as_superuser(pool, f"DELETE FROM event_log WHERE case_id = '{erased}'")
    code, report = await audit(own)
    assert code == 1 and ("removed_after_logging", erased) in found(report), report
    assert not any(f.get("caseId") == expired for f in report["findings"]), report


async def _two_persons_release(hold: dict[str, Any], carol: httpx.AsyncClient,
                               dave: httpx.AsyncClient, cases: list[str]) -> None:
    hold_id = hold["holdId"]
    first_release = await carol.post(f"/holds/{hold_id}/release", json={"reason": "settled"})
    assert first_release.json()["released"] is False
    again = await carol.post(f"/holds/{hold_id}/release", json={"reason": "settled"})
    assert again.status_code == 409
    second_release = await dave.post(f"/holds/{hold_id}/release", json={"reason": "settled"})
    assert second_release.json() == {"holdId": hold_id, "releasedBy": ["carol", "dave"],
                                     "released": True}
    active = (await carol.get("/holds")).json()["holds"]
    assert [h["caseId"] for h in active] == [cases[3]]


async def _from_the_command_line(own: Settings, cases: list[str]) -> None:
    """The same operations as `casetrail retention` / `holds`: the operator holds every
    case of an applicant (a business key, kept as the agent stores it) and reads the plan."""
    placed = await asyncio.to_thread(
        run_cli, own, "holds", "place", "--key",
        f"applicantId={SAMPLE_APPLICATIONS[0]['applicantId']}", "--reason", "Matter 88")
    assert placed.returncode == 0, placed.stderr
    assert orjson.loads(placed.stdout)["scope"] == "business_key"
    planned = await asyncio.to_thread(run_cli, own, "retention", "plan")
    assert planned.returncode == 0, planned.stderr
    held = {c["caseId"]: c["held"] for c in orjson.loads(planned.stdout)["cases"]}
    assert held and all(held.values()), held  # every remaining case is that applicant's
    # The operator is no person whom a second person's approval could be another than:
    # only a person's key sets a policy.
    refused = await asyncio.to_thread(run_cli, own, "retention", "set", "*", "--keep-days",
                                      "200", "--reason", "as the operator")
    assert refused.returncode == 1 and "a person sets" in refused.stderr, refused.stderr


async def test_a_policy_or_a_release_written_with_the_apis_database_password_deletes_nothing(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    """The API's role may insert policies, approvals and releases: rows alone, with no
    action key's signature, make the pass delete nothing and keep a hold in force."""
    children: dict[str, subprocess.Popen[bytes]] = {}
    async with namespace_of_its_own(settings, "retain-forged") as (own, pool, key):
        try:
            async with serving(own, amqp, pool, key, children) as logged:
                base = logged.stack.base_url
                keeper = keeper_of(logged.stack.worker)
                held, other = await decided(logged.client, 2)
                for case_id in (held, other):
                    await backdate(pool, case_id, 200)
                api = await component_pool(own.identity("api"), 1)
                try:
                    await api.execute(
                        "INSERT INTO retention_policies (tenant_id, agent, version, keep_days, "
                        "reason, set_by) VALUES ('default', '*', 1, 183, 'x', 'mallory')")
                    await api.execute(
                        "INSERT INTO retention_approvals (policy_id, approved_by) SELECT "
                        "policy_id, 'eve' FROM retention_policies WHERE version = 1")
                    forged = await keeper.pass_once()
                    assert (forged.expiries_appended, forged.erased) == (0, 0), forged
                    assert REGISTRY.get_sample_value("casetrail_retention_refused_total",
                                                     {"what": "policy"})

                    # A signed policy, and a hold two unsigned rows "release". Against
                    # the forged version it keeps no less; against the last signed one
                    # (none: everything was kept) it deletes: it takes a second person.
                    alice = await person(pool, base, "alice", "retention:manage")
                    bob = await person(pool, base, "bob", "retention:manage")
                    carol = await person(pool, base, "carol", "holds:manage")
                    signed = await alice.put("/retention/policies/*", json={
                        "keepDays": 183, "reason": "six months"})
                    assert signed.status_code == 201, signed.text
                    assert signed.json()["needsSecondPerson"] is True, signed.json()
                    assert signed.json()["inForce"] is False
                    alone = await keeper.pass_once()
                    assert alone.expiries_appended == 0, alone  # one person is not enough
                    approved = await bob.post(
                        f"/retention/policies/{signed.json()['policyId']}/approve")
                    assert approved.status_code == 200, approved.text
                    hold = (await carol.post("/holds", json={
                        "scope": "case", "caseId": held, "reason": "Complaint 9"})).json()
                    for who in ("x", "y"):
                        await api.execute(
                            "INSERT INTO legal_hold_releases (hold_id, person, reason) "
                            "VALUES ($1, $2, 'gone')", uuid.UUID(hold["holdId"]), who)
                finally:
                    await api.close()
                after = await keeper.pass_once()
                assert (after.expiries_appended, after.held) == (1, 1), after
                assert REGISTRY.get_sample_value("casetrail_retention_refused_total",
                                                 {"what": "release"})
                await wait_for_sql(pool, "SELECT count(*) FROM case_tombstones WHERE "
                                   "case_id = $1", uuid.UUID(other))
                assert await pool.fetchval("SELECT count(*) FROM case_tombstones WHERE "
                                           "case_id = $1", uuid.UUID(held)) == 0
                for client in (alice, bob, carol):
                    await client.aclose()
        finally:
            kill_leftovers(children)
