"""A person decides, on the record: a refer waits for review holding no worker, a second
person confirms, overrides or returns it, the worker records who and why, and the trail
that results verifies offline with the reviewer in it. Four eyes: the person who started
a case never reviews it, whatever key they use. On the real stack (RabbitMQ, Postgres)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import aio_pika
import asyncpg
import httpx
import orjson
import pytest
from axe_playwright_python.async_playwright import Axe
from playwright.async_api import Browser, Page, expect
from prometheus_client import REGISTRY
from pydantic import BaseModel, ConfigDict

from casetrail import (
    FINAL_ANSWER,
    Agent,
    AssistantTurn,
    ChatMessage,
    Limits,
    LocalTool,
    call,
    case_input,
    observed,
)
from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings, TenantQuota
from casetrail.contract.auth import AuthError, check_key_scopes
from casetrail.contract.integrity import public_key_text
from casetrail.engine.answers import ASK_A_PERSON
from casetrail.trail.keyfile import worker_signer
from tests.support.browser import DOCS, never_in_a_url, no_flaws, signed_in
from tests.support.cli import check_bundle, run_cli
from tests.support.helpers import ended, registered, wait_until
from tests.support.stack import InProcessStack, in_process_stack

TENANT = "review-tests"
STRICT = "review-strict"
PAIRED = "review-paired"  # an override takes two persons
LATE = "review-late"  # a review is due within a moment
APPROVED, REFERRED = SAMPLE_APPLICATIONS[0], SAMPLE_APPLICATIONS[1]  # A-1001, A-1002


@pytest.fixture(scope="module")
async def stack(settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection,
                pool: asyncpg.Pool) -> AsyncIterator[InProcessStack]:
    """The stack, with tenants whose policies have a person decide every case, two
    persons make an override, and a review due within a moment (swept every second)."""
    strict = settings.model_copy(update={"sweep_seconds": 1.0, "tenant_quotas": {
        STRICT: TenantQuota(review_every_case=True),
        PAIRED: TenantQuota(override_reviewers=2),
        LATE: TenantQuota(review_deadline_seconds=0.5)}})
    async with in_process_stack(strict, amqp, pool) as running:
        yield running


async def key(pool: asyncpg.Pool, scopes: tuple[str, ...], person: str | None = None,
              name: str | None = None, tenant: str = TENANT) -> str:
    made: str = (await ApiKeyStore(pool).create(tenant, scopes, name, None, person))[1]
    return made


class People:
    """Keys of the people in these tests: Sam starts cases, Rita and Ravi review them;
    Sam also holds a reviewer's key of his own (a second key of the same person)."""

    def __init__(self, base_url: str, keys: dict[str, str]) -> None:
        self.base_url, self.keys = base_url, keys

    def as_(self, who: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, timeout=10,
                                 headers={"Authorization": f"Bearer {self.keys[who]}"})


@pytest.fixture(scope="module")
async def people(stack: InProcessStack, pool: asyncpg.Pool) -> People:
    return People(stack.base_url, {
        "sam": await key(pool, ("cases:start", "cases:read", "cases:cancel"), "sam"),
        "sam-reviewing": await key(pool, ("cases:review", "cases:read"), "sam"),
        "rita": await key(pool, ("cases:review", "cases:read"), "rita", "Rita's laptop"),
        "ravi": await key(pool, ("cases:review", "cases:read"), "ravi"),
        "admin": await key(pool, ("admin",)),
        "strict": await key(pool, ("cases:start", "cases:read"), "sam", tenant=STRICT),
        "strict-rita": await key(pool, ("cases:review", "cases:read"), "rita", tenant=STRICT),
        "paired-sam": await key(pool, ("cases:start", "cases:read"), "sam", tenant=PAIRED),
        "paired-rita": await key(pool, ("cases:review", "cases:read"), "rita", tenant=PAIRED),
        "paired-ravi": await key(pool, ("cases:review", "cases:read"), "ravi", tenant=PAIRED),
        "late-sam": await key(pool, ("cases:start", "cases:read"), "sam", tenant=LATE),
        "late-rita": await key(pool, ("cases:review", "cases:read"), "rita", tenant=LATE),
    })


async def parked(people: People, application: dict[str, Any], who: str = "sam") -> str:
    """A loan case started by ``who``, once it waits for review; its id."""
    async with people.as_(who) as client:
        reply = await client.post("/cases", json={"agent": "loan-officer",
                                                   "input": application})
        assert reply.status_code == 202, reply.text
        case_id: str = reply.json()["caseId"]
        case = await ended(client, case_id, timeout=30)
    assert case["status"] == "awaiting_review", case
    return case_id


async def trail_of(people: People, case_id: str, who: str = "sam") -> list[dict[str, Any]]:
    async with people.as_(who) as client:
        events: list[dict[str, Any]] = (await client.get(f"/cases/{case_id}/events")).json()[
            "events"]
    return events


async def settled(people: People, case_id: str, status: str, who: str = "sam"
                  ) -> dict[str, Any]:
    async with people.as_(who) as client:
        async def check() -> dict[str, Any] | None:
            body: dict[str, Any] = (await client.get(f"/cases/{case_id}")).json()
            return body if body["status"] == status else None

        found: dict[str, Any] = await wait_until(check, 30)
    return found


def test_a_reviewers_key_is_a_persons_and_never_starts_cases() -> None:
    check_key_scopes(("cases:review", "cases:read"), "rita")
    for scopes, person in ((("cases:review",), None), (("cases:review", "cases:start"), "rita"),
                           (("cases:review", "admin"), "rita"), (("cases:read",), "a b")):
        with pytest.raises(AuthError):
            check_key_scopes(scopes, person)


async def test_a_refer_waits_holding_no_worker_and_a_second_person_confirms_it(
    people: People, stack: InProcessStack, pool: asyncpg.Pool, settings: Settings,
    tmp_path: Path,
) -> None:
    """Sam's refer waits for review: listed in the queue, no worker holds it. Rita
    confirms; the worker records her review and the case completes, decided by a
    reviewer, in a trail that verifies offline and names both people."""
    case_id = await parked(people, REFERRED)
    assert case_id not in {str(c) for c in stack.worker.live_cases}  # no slot, no memory
    async with people.as_("rita") as rita:
        queue = (await rita.get("/reviews", params={"decision": "refer"})).json()["reviews"]
        waiting = next(r for r in queue if r["caseId"] == case_id)
        assert waiting["reviewReasons"] == ["decision"] and waiting["answer"]["decision"] == \
            "refer"
        assert [r["waitingSince"] for r in queue] == sorted(r["waitingSince"] for r in queue)
        assert waiting["keys"] == {"applicantId": REFERRED["applicantId"]}  # as people know it
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Thin file: the referral stands."})
        assert reply.status_code == 202, reply.text
        assert reply.json()["reviewer"]["subject"] == "rita"
        again = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "once more"})
        assert again.status_code == 409, again.text
    case = await settled(people, case_id, "completed")
    assert case["answer"]["decision"] == "refer"
    trail = await trail_of(people, case_id)
    assert [(e["attempt"], e["eventType"]) for e in trail][-4:] == [
        (1, "CASE_AWAITING_REVIEW"), (2, "CASE_STARTED"), (2, "CASE_REVIEWED"),
        (2, "CASE_COMPLETED")]
    started, reviewed, completed = (e["payload"] for e in trail[-3:])
    assert started["restartReason"] == "review" and started["resumedFrom"]["attempt"] == 1
    sam_key = people.keys["sam"].split("_")[1]
    assert trail[0]["payload"]["startedBy"] == f"key:{sam_key}"
    assert reviewed["reviewer"] == {"subject": "rita", "via": "key",
                                    "keyId": people.keys["rita"].split("_")[1],
                                    "name": "Rita's laptop"}
    assert reviewed["verdict"] == "confirm" and reviewed["reason"].startswith("Thin file")
    assert completed["decidedBy"] == "reviewer" and completed["answer"]["decision"] == "refer"
    assert all(c["passed"] for c in completed["checks"])
    row: Any = await pool.fetchrow("SELECT reviewer, verdict, decision FROM case_reviews "
                                   "WHERE case_id = $1::uuid", case_id)
    assert (row["reviewer"], row["verdict"], row["decision"]) == ("rita", "confirm", None)
    assert await pool.fetchval("SELECT decided_by FROM case_decisions WHERE case_id = $1::uuid",
                               case_id) == "reviewer"
    async with people.as_("sam") as sam:
        verdict = (await sam.get(f"/cases/{case_id}/verify")).json()
        bundle = (await sam.get(f"/cases/{case_id}/bundle")).json()
    assert verdict["verified"] and verdict["complete"], verdict
    assert verdict["reviews"][0]["reviewer"]["subject"] == "rita"
    path = tmp_path / "reviewed.json"
    path.write_bytes(orjson.dumps(bundle))
    checked = await asyncio.to_thread(check_bundle, settings, path,
                                      public_key_text(worker_signer(settings).public_key))
    assert checked.returncode == 0, checked.stderr
    assert "reviewed: confirm by rita (via key" in checked.stdout, checked.stdout


async def test_the_starter_never_reviews_their_own_case_whatever_the_key(
    people: People,
) -> None:
    case_id = await parked(people, REFERRED)
    for who, status in (("sam-reviewing", 403), ("sam", 403), ("admin", 403)):
        async with people.as_(who) as client:
            reply = await client.post(f"/cases/{case_id}/review", json={
                "verdict": "confirm", "reason": "looks right to me"})
        assert reply.status_code == status, (who, reply.text)
    async with people.as_("sam-reviewing") as client:
        reply = await client.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "looks right to me"})
    assert "four eyes" in reply.json()["detail"]
    async with people.as_("ravi") as ravi:  # another person may
        reply = await ravi.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "agreed"})
    assert reply.status_code == 202, reply.text
    await settled(people, case_id, "completed")


async def test_an_override_is_held_to_the_answer_schema_and_then_decides(
    people: People,
) -> None:
    case_id = await parked(people, REFERRED)
    async with people.as_("rita") as rita:
        outside = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "override", "reason": "approve it",
            "decision": {"decision": "approve-please", "applicantId": "A-1002",
                         "rationale": "x"}})
        assert outside.status_code == 422, outside.text
        assert outside.json()["errors"][0]["loc"][:2] == ["body", "decision"]
        missing = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "override", "reason": "approve it"})
        assert missing.status_code == 422, missing.text
        given = {"decision": "decline", "applicantId": "A-1002", "reasonCodes": ["DTI_HIGH"],
                 "rationale": "Verified debts exceed the policy's ratio."}
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "override", "reason": "Debts verified by phone.", "decision": given})
        assert reply.status_code == 202, reply.text
    case = await settled(people, case_id, "completed")
    assert case["answer"]["decision"] == "decline"
    completed = (await trail_of(people, case_id))[-1]["payload"]
    assert completed["decidedBy"] == "reviewer" and completed["answer"]["reasonCodes"] == [
        "DTI_HIGH"]


async def test_a_waiting_case_cancelled_ends_cancelled(people: People) -> None:
    case_id = await parked(people, REFERRED)
    async with people.as_("sam") as sam:
        reply = await sam.post(f"/cases/{case_id}/cancel", json={"reason": "withdrawn"})
        assert reply.status_code == 202, reply.text
    case = await settled(people, case_id, "cancelled")
    assert case["answer"] is None
    trail = await trail_of(people, case_id)
    assert [e["eventType"] for e in trail][-3:] == ["CASE_AWAITING_REVIEW", "CASE_STARTED",
                                                   "CASE_CANCELLED"]
    assert trail[-2]["payload"]["restartReason"] == "cancel"
    assert trail[-1]["payload"]["reason"] == "withdrawn"
    async with people.as_("rita") as rita:  # nothing left to review
        late = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "too late"})
    assert late.status_code == 409, late.text


async def test_a_returned_case_runs_more_cycles_and_comes_back_for_review(
    people: People,
) -> None:
    case_id = await parked(people, REFERRED)
    first = len(await trail_of(people, case_id))
    async with people.as_("rita") as rita:
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "return", "reason": "Fetch the credit score again before referring."})
        assert reply.status_code == 202, reply.text

    async def back() -> list[dict[str, Any]] | None:
        trail = await trail_of(people, case_id)
        return trail if trail[-1]["eventType"] == "CASE_AWAITING_REVIEW" and \
            len(trail) > first else None

    trail = await wait_until(back, 30)
    second = [e for e in trail if e["attempt"] == 2]
    assert [e["eventType"] for e in second][:2] == ["CASE_STARTED", "CASE_REVIEWED"]
    assert "REACT_CYCLE" in [e["eventType"] for e in second]  # the model went on
    cycles = [e["payload"]["cycleIndex"] for e in trail if e["eventType"] == "REACT_CYCLE"]
    assert cycles == list(range(len(cycles)))  # one conversation, carried over
    await settled(people, case_id, "awaiting_review")
    async with people.as_("ravi") as ravi:
        reply = await ravi.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Checked again: refer."})
        assert reply.status_code == 202, reply.text
    await settled(people, case_id, "completed")
    reviewed = [e["payload"]["reviewer"]["subject"] for e in await trail_of(people, case_id)
                if e["eventType"] == "CASE_REVIEWED"]
    assert reviewed == ["rita", "ravi"]


async def test_a_tenant_that_reviews_every_case_has_even_an_approve_wait(
    people: People,
) -> None:
    async with people.as_("strict") as sam:
        reply = await sam.post("/cases", json={"agent": "loan-officer", "input": APPROVED})
        case_id = reply.json()["caseId"]
        case = await ended(sam, case_id, timeout=30)
    assert case["status"] == "awaiting_review" and case["answer"]["decision"] == "approve"
    async with people.as_("strict-rita") as rita:
        waiting = (await rita.get(f"/reviews/{case_id}")).json()
        queued = (await rita.get("/reviews")).json()["reviews"]
        assert next(r for r in queued if r["caseId"] == case_id)["startedByName"] == "sam"
        assert waiting["reviewReasons"] == ["tenant_policy"]
        assert (await rita.get("/reviews", params={"nonsense": "1"})).status_code == 422
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Within policy."})
        assert reply.status_code == 202, reply.text
        done = await ended(rita, case_id, timeout=30)
        assert done["status"] in ("awaiting_review", "completed")


async def test_a_waiting_case_is_held_by_no_worker_and_goes_on_from_the_record(
    settings: Settings, amqp: aio_pika.abc.AbstractRobustConnection, pool: asyncpg.Pool,
    people: People, stack: InProcessStack,
) -> None:
    """The case waits in Postgres alone (no lease, no live case, its start command
    acked): a second worker started and stopped while it waits changes nothing, and a
    redelivered start command finds it parked and runs nothing."""
    case_id = await parked(people, REFERRED)
    waiting: Any = await pool.fetchrow("SELECT parked_attempt, lease_owner, attempts_claimed "
                                  "FROM cases WHERE case_id = $1::uuid", case_id)
    assert waiting["parked_attempt"] == 1 and waiting["lease_owner"] is None
    assert case_id not in {str(c) for c in stack.worker.live_cases}
    async with in_process_stack(settings, amqp, pool):
        pass  # another worker came and went
    claim = await stack.worker.store.claim(uuid.UUID(case_id), "test-owner", 5)
    assert claim.outcome == "parked"
    assert await pool.fetchval("SELECT attempts_claimed FROM cases WHERE case_id = $1::uuid",
                               case_id) == waiting["attempts_claimed"]
    async with people.as_("rita") as rita:
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "After the restart."})
        assert reply.status_code == 202, reply.text
    case = await settled(people, case_id, "completed")
    assert case["answer"]["decision"] == "refer"


async def test_reviews_from_the_terminal_as_a_person_never_as_the_operator(
    settings: Settings, people: People,
) -> None:
    case_id = await parked(people, REFERRED)
    listed = await asyncio.to_thread(run_cli, settings, "reviews", "list", "--tenant", TENANT)
    assert listed.returncode == 0, listed.stderr
    assert case_id in listed.stdout and "refer" in listed.stdout
    shown = await asyncio.to_thread(run_cli, settings, "reviews", "show", case_id)
    assert shown.returncode == 0, shown.stderr
    review = orjson.loads(shown.stdout)
    assert review["reviewReasons"] == ["decision"]
    # The evidence the reviewer decides on, without opening the viewer: each call made.
    called = [(c["cycle"], c["toolName"]) for c in review["toolCalls"]]
    cycles = [cycle for cycle, _ in called]
    assert called and cycles == sorted(cycles), called  # in the order they were made
    assert "credit-score" in {name for _, name in called}
    assert all(("toolResult" in c) != ("error" in c) for c in review["toolCalls"])
    as_operator = await asyncio.to_thread(run_cli, settings, "reviews", "decide", case_id,
                                          "--verdict", "confirm", "--reason", "ok",
                                          CASETRAIL_API_KEY="")
    assert as_operator.returncode == 1 and "person" in as_operator.stderr
    own = await asyncio.to_thread(run_cli, settings, "reviews", "decide", case_id, "--verdict",
                                  "confirm", "--reason", "ok", "--api-key",
                                  people.keys["sam-reviewing"])
    assert own.returncode == 1 and "four eyes" in own.stderr
    decided = await asyncio.to_thread(run_cli, settings, "reviews", "decide", case_id,
                                      "--verdict", "confirm", "--reason", "Agreed.",
                                      "--api-key", people.keys["ravi"])
    assert decided.returncode == 0, decided.stderr
    assert "confirm by ravi" in decided.stdout
    await settled(people, case_id, "completed")


async def test_a_reviewer_decides_in_the_viewer_and_the_page_shows_who(
    browser: Browser, people: People, stack: InProcessStack,
) -> None:
    """Rita finds the refer in the review queue, reads the agent's answer and checks,
    returns nothing but a confirm with her reason; the page follows the case to its end
    and names her as the one who decided."""
    case_id = await parked(people, REFERRED)
    page = await signed_in(browser, stack, people.keys["rita"], "/ui/reviews")
    row = page.locator(f"tr[data-case-id='{case_id}']")
    await expect(row).to_contain_text("refer")
    await expect(row).to_contain_text("the agent sends this decision to a person")
    await expect(row.get_by_role("link")).to_contain_text(REFERRED["applicantId"])
    await no_flaws(page)
    await row.get_by_role("link").click()
    waiting = page.locator("#waiting")
    await expect(waiting).to_contain_text("Awaiting review", timeout=10_000)
    await expect(page.locator("#f-status")).to_have_text("awaiting review")
    await expect(waiting.locator("table.checks tr")).to_have_count(4)  # head + 3 checks
    await no_flaws(page)
    await page.get_by_label("Override it").check()
    await expect(page.get_by_label("Your decision (JSON", exact=False)).to_be_visible()
    await page.get_by_label("Confirm the agent's decision").check()
    await expect(page.get_by_label("Your decision (JSON", exact=False)).to_be_hidden()
    await page.get_by_label("Reason", exact=False).fill("Thin credit file: the referral stands.")
    await page.screenshot(path=str(DOCS / "viewer-review.png"), full_page=True)
    await page.get_by_role("button", name="Record my review").click()
    outcome = page.locator("#outcome")
    await expect(outcome).to_contain_text("Completed", timeout=20_000)
    await expect(outcome).to_contain_text("decided by the reviewer")
    await expect(page.locator("article.reviewed")).to_contain_text("rita")
    await expect(page.locator("#f-decided")).to_contain_text("rita")
    never_in_a_url(page, people.keys["rita"])
    await page.close()


# -- a question to a person, mid-case -------------------------------------------------

class IncomeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    applicantId: str
    statedIncome: int


class IncomeArgs(BaseModel):
    statedIncome: int


class IncomeDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["accept", "decline"]
    verifiedBy: str


def income_band(args: IncomeArgs) -> dict[str, Any]:
    """The income band of a stated income."""
    return {"band": "high" if args.statedIncome > 100_000 else "ordinary"}


def verify_income(messages: Sequence[ChatMessage]) -> AssistantTurn:
    """Asks a person whether the income was verified (beside a tool call of the same
    turn), then decides on the answer."""
    request, seen = case_input(messages), observed(messages)
    if ASK_A_PERSON not in seen:
        return AssistantTurn(text="I cannot verify a stated income myself.", tool_calls=(
            call("income-band", "band-1", statedIncome=request["statedIncome"]),
            call(ASK_A_PERSON, "ask-1", question=f"Has {request['applicantId']}'s stated "
                 f"income of {request['statedIncome']} been verified?")))
    answered = seen[ASK_A_PERSON]
    verdict = "accept" if answered["answer"].lower().startswith("yes") else "decline"
    return AssistantTurn(text=f"The person says: {answered['answer']}", tool_calls=(
        call(FINAL_ANSWER, "final", decision=verdict,
             verifiedBy=answered["answeredBy"]["subject"]),))


INCOME_CHECK = Agent(
    name="income-check", version="1.0.0", description="Accepts a stated income once a "
    "person has confirmed it was verified.", instructions="Ask a person; then decide.",
    input=IncomeRequest, answer=IncomeDecision, tools=[LocalTool(income_band)],
    script=verify_income, asks_people=True,
    limits=Limits(max_cycles=4, deadline_seconds=30))


@pytest.fixture
def income_check() -> Iterator[str]:
    with registered(INCOME_CHECK) as name:
        yield name


async def test_the_model_asks_a_person_and_the_answer_is_on_the_record(
    people: People, income_check: str, settings: Settings, tmp_path: Path,
) -> None:
    """The model asks a person mid-turn: the case waits with the turn (its other call
    already run) in CASE_AWAITING_REVIEW; Rita answers; the next attempt records that
    turn's REACT_CYCLE in full, her answer as the question's result, and the model goes
    on to its decision. No model turn is asked twice."""
    async with people.as_("sam") as sam:
        reply = await sam.post("/cases", json={"agent": income_check, "input": {
            "applicantId": "A-7", "statedIncome": 120_000}})
        assert reply.status_code == 202, reply.text
        case_id = reply.json()["caseId"]
        assert (await ended(sam, case_id, timeout=30))["status"] == "awaiting_review"
    trail = await trail_of(people, case_id)
    assert [e["eventType"] for e in trail] == ["CASE_STARTED", "CASE_AWAITING_REVIEW"]
    assert "ask_a_person" in {t["name"] for t in trail[0]["payload"]["toolsOffered"]}
    waiting = trail[-1]["payload"]
    assert waiting["reviewReasons"] == ["question"] and "answer" not in waiting
    asked = waiting["question"]
    assert asked["callId"] == "ask-1" and asked["question"].startswith("Has A-7")
    assert [c["toolName"] for c in asked["toolCalls"]] == ["income-band"]  # already run
    assert asked["toolCalls"][0]["toolResult"] == {"band": "high"}
    async with people.as_("rita") as rita:
        queue = (await rita.get("/reviews")).json()["reviews"]
        assert next(r for r in queue if r["caseId"] == case_id)["question"]["callId"] == "ask-1"
        review = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "nothing to confirm yet"})
        assert review.status_code == 409, review.text
        wrong = await rita.post(f"/cases/{case_id}/answer", json={
            "callId": "ask-2", "answer": "Yes"})
        assert wrong.status_code == 422, wrong.text
    async with people.as_("sam-reviewing") as sam:  # the starter answers nothing either
        own = await sam.post(f"/cases/{case_id}/answer", json={"callId": "ask-1",
                                                               "answer": "Yes"})
        assert own.status_code == 403, own.text
    async with people.as_("rita") as rita:
        reply = await rita.post(f"/cases/{case_id}/answer", json={
            "callId": "ask-1", "answer": "Yes, payslips checked on 2 December."})
        assert reply.status_code == 202, reply.text
        again = await rita.post(f"/cases/{case_id}/answer", json={
            "callId": "ask-1", "answer": "Yes"})
        assert again.status_code == 409, again.text
    case = await settled(people, case_id, "completed")
    assert case["answer"] == {"decision": "accept", "verifiedBy": "rita"}
    trail = await trail_of(people, case_id)
    assert [(e["attempt"], e["eventType"]) for e in trail] == [
        (1, "CASE_STARTED"), (1, "CASE_AWAITING_REVIEW"), (2, "CASE_STARTED"),
        (2, "REACT_CYCLE"), (2, "REACT_CYCLE"), (2, "CASE_COMPLETED")]
    assert trail[2]["payload"]["restartReason"] == "answer"
    first = trail[3]["payload"]
    assert first["cycleIndex"] == 0
    assert first["reasoningText"] == "I cannot verify a stated income myself."
    assert [c["toolName"] for c in first["toolCalls"]] == ["income-band", "ask_a_person"]
    question = first["toolCalls"][1]
    assert question["toolResult"]["answer"].startswith("Yes, payslips")
    assert question["toolResult"]["answeredBy"]["subject"] == "rita"
    assert question["toolSource"] == "local" and question["toolCallId"] == "ask-1"
    assert trail[4]["payload"]["cycleIndex"] == 1
    assert trail[-1]["payload"]["decidedBy"] == "agent"
    async with people.as_("sam") as sam:
        verdict = (await sam.get(f"/cases/{case_id}/verify")).json()
    assert verdict["verified"] and verdict["complete"], verdict


async def test_a_question_is_answered_in_the_viewer(
    browser: Browser, people: People, stack: InProcessStack, income_check: str,
) -> None:
    async with people.as_("sam") as sam:
        reply = await sam.post("/cases", json={"agent": income_check, "input": {
            "applicantId": "A-8", "statedIncome": 40_000}})
        case_id = reply.json()["caseId"]
        assert (await ended(sam, case_id, timeout=30))["status"] == "awaiting_review"
    page = await signed_in(browser, stack, people.keys["rita"], f"/ui/cases/{case_id}")
    waiting = page.locator("#waiting")
    await expect(waiting).to_contain_text("Has A-8's stated income of 40000 been verified?",
                                          timeout=10_000)
    await expect(waiting.locator(".tool[data-tool='income-band']")).to_contain_text("ordinary")
    await page.get_by_role("textbox", name="Answer").fill("No: nothing on file.")
    await page.get_by_role("button", name="Send my answer").click()
    outcome = page.locator("#outcome")
    await expect(outcome).to_contain_text("Completed", timeout=20_000)
    await expect(outcome).to_contain_text('"decision": "decline"')
    asked = page.locator("article.cycle .tool[data-tool='ask_a_person']")
    await expect(asked).to_contain_text("rita")
    await page.close()


async def test_an_override_takes_a_second_person_where_the_tenant_says_so(
    people: People, settings: Settings, tmp_path: Path,
) -> None:
    """Two persons for an override: Rita's override waits (second_review) with her
    decision; she cannot confirm it herself, Ravi does, and the case completes with the
    overriding decision and both reviews in a trail that verifies offline."""
    case_id = await parked(people, REFERRED, "paired-sam")
    given = {"decision": "decline", "applicantId": "A-1002", "reasonCodes": ["DTI_HIGH"],
             "rationale": "Verified debts exceed the policy's ratio."}
    async with people.as_("paired-rita") as rita:
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "override", "reason": "Debts verified by phone.", "decision": given})
        assert reply.status_code == 202, reply.text

        async def second_wait() -> dict[str, Any] | None:
            found = await rita.get(f"/reviews/{case_id}")
            body: dict[str, Any] = found.json()
            return body if found.status_code == 200 and body["reviewReasons"] == [
                "second_review"] else None

        waiting = await wait_until(second_wait, 30)
        assert waiting["answer"]["decision"] == "decline"
        own = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Confirming my own override."})
        assert own.status_code == 403 and "four eyes" in own.json()["detail"], own.text
    async with people.as_("paired-sam") as sam:
        assert (await sam.get(f"/cases/{case_id}")).json()["status"] == "awaiting_review"
    async with people.as_("paired-ravi") as ravi:
        reply = await ravi.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Agreed: the debts are verified."})
        assert reply.status_code == 202, reply.text
        again = await ravi.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Twice."})
        assert again.status_code == 409, again.text
    case = await settled(people, case_id, "completed", "paired-sam")
    assert case["answer"]["decision"] == "decline"
    async with people.as_("paired-sam") as sam:
        events = (await sam.get(f"/cases/{case_id}/events")).json()["events"]
    reviewed = [(e["payload"]["reviewer"]["subject"], e["payload"]["verdict"])
                for e in events if e["eventType"] == "CASE_REVIEWED"]
    assert reviewed == [("rita", "override"), ("ravi", "confirm")]
    assert events[-1]["payload"]["decidedBy"] == "reviewer"
    assert events[-1]["payload"]["answer"]["reasonCodes"] == ["DTI_HIGH"]
    async with people.as_("paired-sam") as sam:
        bundle = (await sam.get(f"/cases/{case_id}/bundle")).json()
    path = tmp_path / "paired.json"
    path.write_bytes(orjson.dumps(bundle))
    checked = await asyncio.to_thread(check_bundle, settings, path,
                                      public_key_text(worker_signer(settings).public_key))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "override → decline by rita" in checked.stdout, checked.stdout
    assert "confirm by ravi" in checked.stdout, checked.stdout



async def test_an_overdue_review_is_shown_counted_and_never_decided_by_the_clock(
    people: People, browser: Browser, stack: InProcessStack,
) -> None:
    case_id = await parked(people, REFERRED, "late-sam")
    async with people.as_("late-rita") as rita:
        async def overdue() -> dict[str, Any] | None:
            body: dict[str, Any] = (await rita.get(f"/reviews/{case_id}")).json()
            return body if body.get("overdue") else None

        item = await wait_until(overdue, 15)
        due, since = (datetime.fromisoformat(item[k]) for k in ("dueAt", "waitingSince"))
        assert since < due < since + timedelta(seconds=5)
        listed = (await rita.get("/reviews", params={"overdue": "true"})).json()["reviews"]
        assert case_id in {r["caseId"] for r in listed}
        within = (await rita.get("/reviews", params={"overdue": "false"})).json()["reviews"]
        assert case_id not in {r["caseId"] for r in within}

    async def counted() -> bool:
        value = REGISTRY.get_sample_value("casetrail_reviews_overdue",
                                          {"agent": "loan-officer"})
        return value is not None and value >= 1

    await wait_until(counted, 15)
    page = await signed_in(browser, stack, people.keys["late-rita"], "/ui/reviews")
    row = page.locator(f"tr[data-case-id='{case_id}']")
    await expect(row.locator(".badge.overdue")).to_contain_text("Overdue since")
    await page.goto(f"{stack.base_url}/ui/cases/{case_id}")
    await expect(page.locator("#waiting .badge.overdue")).to_contain_text("Overdue since")
    await page.close()
    await asyncio.sleep(1.5)  # past its due time, it still waits: people decide
    async with people.as_("late-sam") as sam:
        assert (await sam.get(f"/cases/{case_id}")).json()["status"] == "awaiting_review"
    async with people.as_("late-rita") as rita:
        reply = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Late, and confirmed."})
        assert reply.status_code == 202, reply.text


async def test_a_tenants_sql_reader_sees_only_its_own_reviews(
    people: People, settings: Settings, pool: asyncpg.Pool,
) -> None:
    """``case_reviews`` runs with the reader's rights: each tenant's reader role sees
    the reviews of its own cases, never another tenant's."""
    reviewed: dict[str, str] = {}
    for tenant, starter, reviewer in ((TENANT, "sam", "rita"), (STRICT, "strict", "strict-rita")):
        case_id = await parked(people, REFERRED, starter)
        async with people.as_(reviewer) as client:
            reply = await client.post(f"/cases/{case_id}/review", json={
                "verdict": "confirm", "reason": "Seen by the tenant's reviewer."})
            assert reply.status_code == 202, reply.text
        await settled(people, case_id, "completed", starter)
        reviewed[tenant] = case_id
    try:
        for tenant, case_id in reviewed.items():
            made = await asyncio.to_thread(run_cli, settings, "sql-role", "create",
                                           "--tenant", tenant)
            assert made.returncode == 0, made.stderr
            conn = await asyncpg.connect(made.stdout.strip())
            try:
                rows = await conn.fetch("SELECT case_id::text, tenant_id, reviewer "
                                        "FROM case_reviews")
            finally:
                await conn.close()
            assert case_id in {r["case_id"] for r in rows}
            assert {r["tenant_id"] for r in rows} == {tenant}, rows
            other = next(c for t, c in reviewed.items() if t != tenant)
            assert other not in {r["case_id"] for r in rows}
    finally:
        for tenant in reviewed:
            await asyncio.to_thread(run_cli, settings, "sql-role", "drop", "--tenant", tenant)


async def axe_serious(page: Page) -> list[str]:
    """axe-core's serious and critical violations on the page as shown."""
    found = await Axe().run(page)
    return [f"{v['id']} ({v['impact']}): {v['help']} at "
            + "; ".join(str(n["target"]) for n in v["nodes"][:3])
            for v in found.response["violations"] if v["impact"] in ("serious", "critical")]


async def test_the_reviewers_pages_pass_axe_and_a_review_is_done_by_keyboard(
    browser: Browser, people: People, stack: InProcessStack,
) -> None:
    """axe-core (in Chromium) finds nothing serious or critical on the case list, the
    review queue, a waiting case with its form and a decided case; and a reviewer
    decides with the keyboard alone."""
    case_id = await parked(people, REFERRED)
    page = await signed_in(browser, stack, people.keys["rita"], "/ui/")
    await expect(page.locator("table.cases")).to_be_visible()
    problems = {"list": await axe_serious(page)}
    await page.goto(f"{stack.base_url}/ui/reviews")
    await expect(page.locator(f"tr[data-case-id='{case_id}']")).to_be_visible()
    problems["review queue"] = await axe_serious(page)
    await page.goto(f"{stack.base_url}/ui/cases/{case_id}")
    await expect(page.locator("form.review")).to_be_visible(timeout=10_000)
    problems["waiting case"] = await axe_serious(page)
    # By keyboard: Tab from the page's top to the verdict, the reason and the button.
    await page.locator("body").focus()
    assert await tab_to(page, "document.activeElement.name === 'verdict'")
    assert await page.evaluate("document.activeElement.value") == "confirm"
    assert await tab_to(page, "document.activeElement.name === 'reason'")
    await page.keyboard.type("Checked by phone, by keyboard.")
    assert await tab_to(page, "document.activeElement.type === 'submit'")
    await page.keyboard.press("Enter")
    await expect(page.locator("#outcome")).to_contain_text("Completed", timeout=20_000)
    problems["decided case"] = await axe_serious(page)
    assert not any(problems.values()), problems
    await page.close()


async def tab_to(page: Page, focused: str, limit: int = 80) -> bool:
    """Press Tab until ``focused`` (a JavaScript expression) holds; whether it did."""
    for _ in range(limit):
        await page.keyboard.press("Tab")
        if await page.evaluate(focused):
            return True
    return False
