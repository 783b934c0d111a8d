"""A person's decision that no component can forge and no race can bend, tried as an
attacker would on the real stack (RabbitMQ, Postgres): an action written with the API's
database password alone is refused and the case then decided by a real reviewer; the
overrider racing to confirm their own override while the consumer is held back gets no
202; an answer never lands on a review's wait; every review and answer carries what the
API signed, and ``verify-bundle`` checks it against the action keys the auditor
trusts."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx
import orjson
import pytest
from prometheus_client import REGISTRY

from casetrail.adapters.store import ApiKeyStore, component_pool
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings, TenantQuota
from casetrail.contract.integrity import Signer, public_key_text
from casetrail.trail.keyfile import action_signer, worker_signer
from casetrail.trail.person_actions import PersonAction, sign_action
from tests.support.helpers import ended, wait_until
from tests.support.stack import InProcessStack, in_process_stack

TENANT = "integrity-tests"
PAIRED = "integrity-paired"  # an override takes two persons
REFERRED = SAMPLE_APPLICATIONS[1]  # A-1002: the agent refers it
OVERRIDE = {"decision": "decline", "applicantId": "A-1002", "reasonCodes": ["DTI_HIGH"],
            "rationale": "Verified debts exceed the policy's ratio."}


@pytest.fixture(scope="module")
async def stack(settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
                pool: asyncpg.Pool) -> AsyncIterator[InProcessStack]:
    """The stack, sweeping every second, with a tenant where an override takes two."""
    own = settings.model_copy(update={"sweep_seconds": 1.0, "tenant_quotas": {
        PAIRED: TenantQuota(override_reviewers=2)}})
    async with in_process_stack(own, amqp, pool) as running:
        yield running


@pytest.fixture(scope="module")
async def keys(stack: InProcessStack, pool: asyncpg.Pool) -> dict[str, str]:
    """Sam starts cases; Rita and Ravi review them."""
    store = ApiKeyStore(pool)
    made = {}
    for who, tenant, scopes, person in (
            ("sam", TENANT, ("cases:start", "cases:read", "cases:cancel"), "sam"),
            ("rita", TENANT, ("cases:review", "cases:read"), "rita"),
            ("paired-sam", PAIRED, ("cases:start", "cases:read"), "sam"),
            ("paired-rita", PAIRED, ("cases:review", "cases:read"), "rita"),
            ("paired-ravi", PAIRED, ("cases:review", "cases:read"), "ravi")):
        made[who] = (await store.create(tenant, scopes, None, None, person))[1]
    return made


def as_(stack: InProcessStack, keys: dict[str, str], who: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                             headers={"Authorization": f"Bearer {keys[who]}"})


async def waiting_case(stack: InProcessStack, keys: dict[str, str], who: str) -> str:
    """A referred loan case started by ``who``, once it waits for review; its id."""
    async with as_(stack, keys, who) as client:
        reply = await client.post("/cases", json={"agent": "loan-officer", "input": REFERRED})
        assert reply.status_code == 202, reply.text
        case_id: str = reply.json()["caseId"]
        case = await ended(client, case_id, timeout=30)
    assert case["status"] == "awaiting_review", case
    return case_id


async def settled(stack: InProcessStack, keys: dict[str, str], who: str, case_id: str,
                  status: str) -> dict[str, Any]:
    async with as_(stack, keys, who) as client:
        async def check() -> dict[str, Any] | None:
            body: dict[str, Any] = (await client.get(f"/cases/{case_id}")).json()
            return body if body["status"] == status else None

        found: dict[str, Any] = await wait_until(check, 30)
    return found


async def events_of(stack: InProcessStack, keys: dict[str, str], who: str, case_id: str
                    ) -> list[dict[str, Any]]:
    async with as_(stack, keys, who) as client:
        events: list[dict[str, Any]] = (await client.get(f"/cases/{case_id}/events")).json()[
            "events"]
    return events


async def noted_wait(pool: asyncpg.Pool, case_id: str, kind: str) -> asyncpg.Record:
    """The case's wait once the worker has noted one of ``kind``."""
    async def check() -> asyncpg.Record | None:
        found: asyncpg.Record | None = await pool.fetchrow(
            "SELECT parked_attempt, wait_kind, wait_excludes FROM cases "
            "WHERE case_id = $1 AND wait_kind = $2", uuid.UUID(case_id), kind)
        return found

    noted: asyncpg.Record = await wait_until(check, 30)
    return noted


@asynccontextmanager
async def consumer_held_back(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """No event reaches ``event_log`` while the block runs (the consumer's insert waits
    on a lock), as when the consumer is slow or stopped: the worker goes on, notes its
    waits, and the API sees what the worker noted, not yet the events."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("LOCK TABLE event_log IN SHARE MODE")
        yield


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("casetrail_person_actions_refused_total",
                                     {"reason": reason}) or 0.0


async def forge(settings: Settings, case_id: str, signed: dict[str, Any] | None = None,
                key_id: str | None = None, sig: str | None = None,
                when: datetime | None = None) -> None:
    """As the API's database role, with nothing else: a review by "ceo" overriding the
    case with a decision outside the agent's answer schema, nothing published."""
    api = await component_pool(settings.identity("api"), 1)
    try:
        await api.execute(
            """INSERT INTO case_actions (case_id, parked_attempt, kind, verdict, reason,
                                         decision, reviewer, signed, key_id, sig, acted_at)
               SELECT case_id, parked_attempt, 'review', 'override', 'forged', $2, $3, $4,
                      $5, $6, coalesce($7, now()) FROM cases WHERE case_id = $1""",
            uuid.UUID(case_id), {"decision": "wire-all-funds", "evil": True},
            {"subject": "ceo", "via": "oidc"}, signed, key_id, sig, when)
    finally:
        await api.close()


@pytest.mark.parametrize("signature", ["unsigned", "bad_signature"])
async def test_an_action_forged_with_the_apis_database_password_is_refused(
    stack: InProcessStack, keys: dict[str, str], settings: Settings, pool: asyncpg.Pool,
    signature: str,
) -> None:
    """The forged row is never recorded: no CASE_REVIEWED, the row moved aside to
    case_actions_refused and counted; the case waits again and a real reviewer then
    decides it, on a trail that verifies with the API's signed action in it."""
    case_id = await waiting_case(stack, keys, "sam")
    before = refused(signature)
    if signature == "unsigned":
        await forge(settings, case_id)
    else:  # signed, but with a key of the attacker's own that no operator registered
        wait, when = await noted_wait(pool, case_id, "review"), datetime.now(UTC)
        theirs = sign_action(Signer.generate(), PersonAction(
            uuid.UUID(case_id), TENANT, wait["parked_attempt"], "review", "review",
            when, person={"subject": "ceo", "via": "oidc"}, verdict="override",
            reason="forged", decision={"decision": "wire-all-funds", "evil": True}))
        await forge(settings, case_id, theirs.signed, theirs.key_id, theirs.sig, when)

    async def moved_aside() -> asyncpg.Record | None:
        found: asyncpg.Record | None = await pool.fetchrow(
            "SELECT why_code, reviewer FROM case_actions_refused WHERE case_id = $1",
            uuid.UUID(case_id))
        return found

    aside = await wait_until(moved_aside, 30)  # the sweeper re-sent the case's start
    assert aside["why_code"] == signature
    assert aside["reviewer"] == {"subject": "ceo", "via": "oidc"}
    assert refused(signature) == before + 1
    assert await pool.fetchval("SELECT count(*) FROM case_actions WHERE case_id = $1",
                               uuid.UUID(case_id)) == 0
    async with as_(stack, keys, "rita") as rita:
        assert (await rita.get(f"/reviews/{case_id}")).status_code == 200  # open again
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Referred rightly: income unverified."})
        assert reply.status_code == 202, reply.text
    case = await settled(stack, keys, "sam", case_id, "completed")
    assert case["answer"]["decision"] == "refer"
    events = await events_of(stack, keys, "sam", case_id)
    reviews = [e["payload"] for e in events if e["eventType"] == "CASE_REVIEWED"]
    assert [r["reviewer"]["subject"] for r in reviews] == ["rita"]
    assert reviews[0]["action"]["keyId"] == action_signer(settings).key_id
    assert reviews[0]["action"]["signed"]["kind"] == "review"
    async with as_(stack, keys, "sam") as sam:
        verdict = (await sam.get(f"/cases/{case_id}/verify")).json()
    assert verdict["verified"] is True and not verdict.get("warnings"), verdict


async def test_the_overrider_never_confirms_their_own_override_however_raced(
    stack: InProcessStack, keys: dict[str, str], pool: asyncpg.Pool,
) -> None:
    """Rita overrides with the consumer held back: the worker records her review and
    parks for a second person before any of it is stored. Rita's confirms, fired four
    at a time into that window, are all refused (403: the wait excludes her); Ravi's
    then decides the case."""
    case_id = await waiting_case(stack, keys, "paired-sam")
    statuses: list[int] = []
    async with consumer_held_back(pool), as_(stack, keys, "paired-rita") as rita:
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "override", "reason": "Debts verified by phone.",
            "decision": OVERRIDE})
        assert reply.status_code == 202, reply.text
        second = await noted_wait(pool, case_id, "second_review")
        assert set(second["wait_excludes"]) == {"sam", "rita"}
        assert await pool.fetchval(  # the window: the worker is ahead of the log
            "SELECT count(*) FROM event_log WHERE case_id = $1 AND attempt = $2",
            uuid.UUID(case_id), second["parked_attempt"]) == 0

        async def confirm_own() -> None:
            for _ in range(10):
                done = await rita.post(f"/cases/{case_id}/review", json={
                    "verdict": "confirm", "reason": "Confirming my own override."})
                statuses.append(done.status_code)

        await asyncio.gather(*(confirm_own() for _ in range(4)))
    assert statuses and set(statuses) == {403}, statuses
    async with as_(stack, keys, "paired-ravi") as ravi:
        async def second_review_listed() -> bool:
            found = await ravi.get(f"/reviews/{case_id}")
            return found.status_code == 200 and found.json()["reviewReasons"] == [
                "second_review"]

        await wait_until(second_review_listed, 30)
        reply = await ravi.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Agreed: the debts are verified."})
        assert reply.status_code == 202, reply.text
    case = await settled(stack, keys, "paired-sam", case_id, "completed")
    assert case["answer"]["decision"] == "decline"
    events = await events_of(stack, keys, "paired-sam", case_id)
    assert [(e["payload"]["reviewer"]["subject"], e["payload"]["verdict"])
            for e in events if e["eventType"] == "CASE_REVIEWED"] == [
        ("rita", "override"), ("ravi", "confirm")]


async def test_an_answer_is_never_kept_against_a_review_wait(
    stack: InProcessStack, keys: dict[str, str], pool: asyncpg.Pool,
) -> None:
    """With the consumer held back, an answer to a question nobody asked finds the
    review wait the worker noted and is refused; the case stays in the review queue."""
    case_id = await waiting_case(stack, keys, "sam")
    async with consumer_held_back(pool), as_(stack, keys, "rita") as rita:
        reply = await rita.post(f"/cases/{case_id}/answer",
                                json={"callId": "ask-1", "answer": "No."})
        assert reply.status_code == 409, reply.text
    assert await pool.fetchval("SELECT count(*) FROM case_actions WHERE case_id = $1",
                               uuid.UUID(case_id)) == 0
    async with as_(stack, keys, "rita") as rita:
        assert (await rita.get(f"/reviews/{case_id}")).status_code == 200
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Referred rightly."})
        assert reply.status_code == 202, reply.text
    await settled(stack, keys, "sam", case_id, "completed")


def verify_bundle_cli(settings: Settings, path: Path, *args: str
                      ) -> subprocess.CompletedProcess[str]:
    """``verify-bundle`` with the broker and the database out of reach."""
    return subprocess.run(
        [sys.executable, "-m", "casetrail.cli", "verify-bundle", str(path), *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={**settings.environment(), "CASETRAIL_AMQP_URL": "amqp://nobody:x@127.0.0.1:1/",
             "CASETRAIL_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})


async def test_a_bundle_checks_each_reviews_signed_action_against_trusted_action_keys(
    stack: InProcessStack, keys: dict[str, str], settings: Settings, tmp_path: Path,
) -> None:
    """Offline: verified with the API's action key trusted; not verified with another
    key trusted; without --trust-action, verified with a warning that the actions'
    signatures were not checked; a review altered after signing fails."""
    case_id = await waiting_case(stack, keys, "sam")
    async with as_(stack, keys, "rita") as rita:
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Referred rightly."})
        assert reply.status_code == 202, reply.text
    await settled(stack, keys, "sam", case_id, "completed")
    async with as_(stack, keys, "sam") as sam:
        bundle = (await sam.get(f"/cases/{case_id}/bundle")).json()
    path = tmp_path / "reviewed.json"
    path.write_bytes(orjson.dumps(bundle))
    worker = public_key_text(worker_signer(settings).public_key)
    api = public_key_text(action_signer(settings).public_key)
    checks: list[Callable[[], Awaitable[subprocess.CompletedProcess[str]]]] = [
        lambda: asyncio.to_thread(verify_bundle_cli, settings, path, "--trust", worker,
                                  "--trust-action", api),
        lambda: asyncio.to_thread(verify_bundle_cli, settings, path, "--trust", worker,
                                  "--trust-action", public_key_text(
                                      Signer.generate().public_key)),
        lambda: asyncio.to_thread(verify_bundle_cli, settings, path, "--trust", worker)]
    trusted, other, none = [await check() for check in checks]
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    assert "confirm by rita" in trusted.stdout and "warning" not in trusted.stdout
    assert other.returncode == 1 and "bad_action_signature" in other.stderr, other.stderr
    assert none.returncode == 0 and "action_unchecked" in none.stdout, none.stdout


@pytest.mark.parametrize("scopes", [("cases:cancel",), ("models:override",)])
async def test_the_review_queue_is_read_only_with_cases_review_or_cases_read(
    stack: InProcessStack, keys: dict[str, str], pool: asyncpg.Pool, scopes: tuple[str, ...],
) -> None:
    """A key that may only cancel, or only choose models, sees neither the queue nor one
    case of it (its answer, checks and starter)."""
    case_id = await waiting_case(stack, keys, "sam")
    narrow = (await ApiKeyStore(pool).create(TENANT, scopes, None))[1]
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10, headers={
            "Authorization": f"Bearer {narrow}"}) as client:
        one, queue = await client.get(f"/reviews/{case_id}"), await client.get("/reviews")
    assert one.status_code == 403 and "cases:review" in one.json()["detail"], one.text
    assert queue.status_code == 403, queue.text
    async with as_(stack, keys, "rita") as rita:  # a reviewer does see it
        assert (await rita.get(f"/reviews/{case_id}")).status_code == 200


@pytest.mark.parametrize("signature", ["unsigned", "replayed"])
async def test_a_case_row_forged_with_the_apis_database_password_never_runs(
    stack: InProcessStack, keys: dict[str, str], settings: Settings, pool: asyncpg.Pool,
    signature: str,
) -> None:
    """As the API's role: a case row "started by" the CEO, claimed once with a lapsed
    lease so that a worker's sweeper sends its start command. Unsigned, or carrying a
    genuine case's signed start (another case id, agent and input), the worker refuses
    it: no event of it is signed, the refusal is counted, and the sweeper lets it be."""
    label = f"start_{'unsigned' if signature == 'unsigned' else 'mismatch'}"
    before = refused(label)
    signed = None
    if signature == "replayed":
        genuine = await waiting_case(stack, keys, "sam")
        signed = (await pool.fetchval("SELECT start_action FROM cases WHERE case_id = $1",
                                      uuid.UUID(genuine)))
        assert signed["signed"]["caseId"] == genuine
    forged = uuid.uuid4()
    api = await component_pool(settings.identity("api"), 1)
    try:
        await api.execute(
            """INSERT INTO cases (case_id, agent, input, model, limits, request_digest,
                                  tenant_id, started_by, start_action, attempts_claimed,
                                  lease_expires_at)
               VALUES ($1, 'loan-officer', $2,
                       '{"provider": "scripted", "name": "loan-officer-scripted"}',
                       '{"maxCycles": 5, "deadlineSeconds": 60}', 'forged', $3, 'oidc:ceo',
                       $4, 1, now() - interval '1 hour')""",
            forged, REFERRED, TENANT, signed)
    finally:
        await api.close()

    async def refused_once() -> bool:
        return refused(label) >= before + 1

    await wait_until(refused_once, 30)  # the sweeper sent it; the worker refused it
    assert await pool.fetchval("SELECT count(*) FROM event_log WHERE case_id = $1",
                               forged) == 0
    assert await pool.fetchval("SELECT terminal_published FROM cases WHERE case_id = $1",
                               forged) is True  # set aside: not sent again


async def test_a_review_kept_before_the_waiting_attempt_is_stored_is_not_left_behind(
    stack: InProcessStack, keys: dict[str, str], pool: asyncpg.Pool,
) -> None:
    """The worker notes a wait once the broker confirms its CASE_AWAITING_REVIEW; the
    consumer may store it later (slow, stopped). A person who reviews in between is not
    left behind: the next attempt waits for the stored record of the attempt that
    waited, then records the review and completes; the case waits once, not twice."""
    async with consumer_held_back(pool), as_(stack, keys, "sam") as sam, \
            as_(stack, keys, "rita") as rita:
        reply = await sam.post("/cases", json={"agent": "loan-officer", "input": REFERRED})
        assert reply.status_code == 202, reply.text
        case_id = reply.json()["caseId"]
        wait = await noted_wait(pool, case_id, "review")
        assert await pool.fetchval("SELECT count(*) FROM event_log WHERE case_id = $1",
                                   uuid.UUID(case_id)) == 0  # nothing stored yet
        reviewed = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Referred rightly: income unverified."})
        assert reviewed.status_code == 202, reviewed.text
        await asyncio.sleep(1.5)  # the next attempt is claimed, and waits for the record
    case = await settled(stack, keys, "sam", case_id, "completed")
    assert case["answer"]["decision"] == "refer"
    events = await events_of(stack, keys, "sam", case_id)
    kinds = [(e["attempt"], e["eventType"]) for e in events]
    assert kinds.count((wait["parked_attempt"], "CASE_AWAITING_REVIEW")) == 1
    assert [t for _, t in kinds].count("CASE_AWAITING_REVIEW") == 1, kinds
    assert [t for _, t in kinds].count("CASE_REVIEWED") == 1, kinds
