"""The trail viewer in a real browser: Debian's Chromium, driven by Playwright, against
the real stack. A slow case's page fills in cycle by cycle without a reload and ends
with the decision; the list filters; another tenant's case is not shown; the key never
appears in a URL. Screenshots of the list and of a case page go to ``docs/``."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Literal

import asyncpg
import httpx
import orjson
import pypdf
import pytest
from playwright.async_api import Browser, Route, expect
from pydantic import BaseModel, ConfigDict

from casetrail import FINAL_ANSWER, Agent, AssistantTurn, ChatMessage, Limits, call
from casetrail.adapters.store import ApiKeyStore
from casetrail.agents import loan_officer
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.audit.evidence import verify_bundle
from casetrail.config import Settings
from casetrail.trail.keyfile import worker_signer
from tests.support.browser import DOCS, never_in_a_url, no_flaws, shown_in_full, signed_in
from tests.support.helpers import ended, registered
from tests.support.records import forge_tool_result
from tests.support.stack import InProcessStack, module_stack

stack = module_stack(worker_concurrency=8)

SCOPES = ("cases:start", "cases:read", "models:override")


@pytest.fixture(scope="module")
async def viewer_key(pool: asyncpg.Pool) -> str:
    _, key = await ApiKeyStore(pool).create("lender", SCOPES, "viewer tests")
    return key


@pytest.fixture(scope="module")
async def lender(stack: InProcessStack, viewer_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                                 headers={"Authorization": f"Bearer {viewer_key}"}) as http:
        yield http


async def test_a_running_case_fills_in_live_and_ends_with_its_decision(
    browser: Browser, stack: InProcessStack, lender: httpx.AsyncClient, viewer_key: str,
) -> None:
    slow = {"agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0],
            "model": {"provider": "scripted", "name": "slow", "latencyMs": 900}}
    case_id = (await lender.post("/cases", json=slow)).json()["caseId"]
    page = await signed_in(browser, stack, viewer_key, f"/ui/cases/{case_id}")
    # Layout shifts (the browser's own measure, as in Core Web Vitals' CLS), from now on.
    await page.evaluate("""() => { window.shifts = 0; new PerformanceObserver((list) => {
        for (const e of list.getEntries()) if (!e.hadRecentInput) window.shifts += e.value;
      }).observe({ type: "layout-shift" }); }""")
    cycles = page.locator("article.cycle")
    # Cycles arrive one by one on the same page (no reload): 1, then 2, ...
    await expect(cycles).to_have_count(1, timeout=10_000)
    assert await page.locator("#outcome").count() == 0  # still running
    await expect(cycles).to_have_count(2, timeout=10_000)
    await expect(cycles).to_have_count(4, timeout=15_000)
    outcome = page.locator("#outcome")
    await expect(outcome).to_contain_text("Completed", timeout=10_000)
    await expect(outcome).to_contain_text("approve")
    await expect(page.locator("#f-decision")).to_have_text("approve")
    await expect(page.locator("#f-status")).to_have_text("completed")
    await expect(page.locator("#f-integrity")).to_contain_text("verified")
    await expect(page.locator("#f-checks")).to_have_text("3 of 3 passed")
    await expect(page.locator("#f-tenant")).to_have_text("lender")
    # The decision first: why, in the answer's words, under the applicant's id.
    await expect(page.locator("h1")).to_have_text("A-1001")
    await expect(page.locator("#summary")).to_contain_text("Credit score 742")
    # Tool-call cards: name, source, arguments, result, duration.
    first_tool = cycles.first.locator(".tool").first
    await expect(first_tool.locator(".name")).to_have_text("credit-score")
    await expect(first_tool).to_contain_text("worker")
    await expect(first_tool).to_contain_text("Arguments")
    await expect(first_tool).to_contain_text("Result")
    # JSON in the record's own key order (the signed body's, RFC 8785), not jsonb's.
    result = await first_tool.locator("pre").last.inner_text()
    assert result.index('"applicantId"') < result.index('"bureau"') < result.index('"score"')
    # The final answer (not a tool call) and each check's verdict.
    await expect(cycles.last.locator("details.answer")).to_contain_text('"decision": "approve"')
    applicant = outcome.locator("table.checks tr[data-check='names-the-applicant']")
    await expect(applicant).to_contain_text("passed")
    await expect(applicant).to_contain_text("every call and the answer name A-1001")
    assert await page.locator(".chart .bar-pair").count() == 4
    assert await page.evaluate("window.shifts") < 0.05  # nothing already shown moved
    # The applicant's name is a placeholder for a key without pii:read.
    await expect(page.locator("article.started")).to_contain_text("[pii:applicantName]")
    await no_flaws(page)
    await page.screenshot(path=str(DOCS / "viewer-case.png"), full_page=True)
    never_in_a_url(page, viewer_key)
    await page.close()


async def test_the_list_filters_and_hides_other_tenants_cases(
    browser: Browser, stack: InProcessStack, lender: httpx.AsyncClient, viewer_key: str,
    client: httpx.AsyncClient,
) -> None:
    mine = []
    for application in SAMPLE_APPLICATIONS[:3]:
        case_id = (await lender.post("/cases", json={"agent": "loan-officer",
                                                     "input": application})).json()["caseId"]
        mine.append(await ended(lender, case_id))
    theirs = (await client.post("/cases", json={"agent": "loan-officer",
                                                "input": SAMPLE_APPLICATIONS[0]})).json()
    await ended(client, theirs["caseId"])

    page = await signed_in(browser, stack, viewer_key)
    rows = page.locator("table.cases tbody tr[data-case-id]")
    await expect(rows.first).to_be_visible()
    # The header says whose cases these are: the tenant and the key's id, never the key.
    key_id = viewer_key.split("_")[1]
    await expect(page.locator("#who")).to_have_text(f"lender · key:{key_id}")
    shown = await rows.evaluate_all("rows => rows.map(r => r.dataset.caseId)")
    assert {c["caseId"] for c in mine} <= set(shown)
    assert theirs["caseId"] not in shown  # another tenant's case
    # Each case named as people know it: the applicant's id, then the start of its id.
    first = page.locator(f"tr[data-case-id='{mine[0]['caseId']}'] a.id")
    await expect(first).to_have_text(f"{SAMPLE_APPLICATIONS[0]['applicantId']}"
                                     f"{mine[0]['caseId'][:8]}")
    await no_flaws(page)
    await page.screenshot(path=str(DOCS / "viewer-list.png"), full_page=True)

    decision = mine[-1]["answer"]["decision"]
    await page.get_by_label("Decision").fill(decision)
    await page.get_by_role("button", name="Search").click()
    await expect(page).to_have_url(re.compile(rf"decision={decision}"))
    await shown_in_full(page)
    badges = await page.locator("table.cases tbody td:nth-child(4)").all_inner_texts()
    assert badges and set(badges) == {decision}

    # By the identifier a reviewer has: the applicant id (a business key).
    await page.get_by_role("button", name="Clear").click()
    await shown_in_full(page)
    applicant = SAMPLE_APPLICATIONS[1]["applicantId"]
    await page.get_by_label("Applicant / customer id").fill(applicant)
    await page.get_by_role("button", name="Search").click()
    await expect(page).to_have_url(re.compile(rf"key={applicant}"))
    await shown_in_full(page)
    found = await rows.evaluate_all("rows => rows.map(r => r.dataset.caseId)")
    assert mine[1]["caseId"] in found
    assert not {mine[0]["caseId"], mine[2]["caseId"]} & set(found)  # other applicants

    # Keyboard: the first case's link is reachable with Tab and opens its page.
    await page.get_by_role("button", name="Clear").click()
    await expect(page).to_have_url(stack.base_url + "/ui/")
    await shown_in_full(page)
    link = rows.first.locator("a")
    await link.focus()
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(re.compile(r"/ui/cases/[0-9a-f-]{36}$"))
    await expect(page.locator("#outcome")).to_be_visible(timeout=10_000)
    never_in_a_url(page, viewer_key)
    await page.close()


async def test_an_answer_for_a_page_left_behind_never_replaces_the_page_shown(
    browser: Browser, stack: InProcessStack, viewer_key: str,
) -> None:
    page = await signed_in(browser, stack, viewer_key)
    await shown_in_full(page)
    released = asyncio.Event()

    async def held(route: Route) -> None:
        await released.wait()
        await route.continue_()

    await page.route(re.compile(r"/cases\?.*decision=refer"), held)
    await page.get_by_label("Decision").fill("refer")
    await page.get_by_role("button", name="Search").click()
    await expect(page.locator("main")).to_have_attribute("aria-busy", "true")
    await page.go_back()  # the reader moves on before the filtered list arrives
    await expect(page).to_have_url(stack.base_url + "/ui/")
    await shown_in_full(page)

    async with page.expect_response(re.compile(r"decision=refer")):
        released.set()
    await page.evaluate("() => new Promise((done) => setTimeout(done, 200))")
    assert page.url == stack.base_url + "/ui/"
    await expect(page.get_by_label("Decision")).to_have_value("")  # not the filtered page
    await page.close()


async def test_an_ended_case_offers_its_bundle_and_marks_an_altered_event(
    browser: Browser, stack: InProcessStack, lender: httpx.AsyncClient, viewer_key: str,
    pool: asyncpg.Pool, settings: Settings, tmp_path: Path,
) -> None:
    case_id = (await lender.post("/cases", json={"agent": "loan-officer",
                                                 "input": SAMPLE_APPLICATIONS[0]})).json()
    case_id = (await ended(lender, case_id["caseId"]))["caseId"]
    page = await signed_in(browser, stack, viewer_key, f"/ui/cases/{case_id}")
    await expect(page.locator("#f-integrity")).to_have_text("verified, complete",
                                                            timeout=10_000)
    await expect(page.locator(".problems")).to_be_hidden()

    # The evidence bundle, saved from the page, verifies offline against the worker's key.
    async with page.expect_download() as saving:
        await page.get_by_role("button", name="Download evidence bundle").click()
    saved = await saving.value
    assert saved.suggested_filename == f"case-{case_id}.bundle.json"
    await saved.save_as(tmp_path / saved.suggested_filename)
    bundle = orjson.loads((tmp_path / saved.suggested_filename).read_bytes())
    report = verify_bundle(bundle, [worker_signer(settings).public_key])
    assert bundle["caseId"] == case_id and report.verified and report.complete
    # The decision and the checks are read without scrolling; the report downloads.
    height = page.viewport_size["height"] if page.viewport_size else 720
    for shown in ("#summary", "#f-checks", "#f-decision"):
        box = await page.locator(shown).bounding_box()
        assert box is not None and box["y"] + box["height"] <= height, (shown, box)
    async with page.expect_download() as saving:
        await page.get_by_role("button", name="Download report (PDF)").click()
    pdf = await saving.value
    assert pdf.suggested_filename == f"casetrail-{case_id}.pdf"
    await pdf.save_as(tmp_path / pdf.suggested_filename)
    text = "\n".join(p.extract_text() for p in pypdf.PdfReader(
        tmp_path / pdf.suggested_filename).pages)
    assert text.startswith("Case report") and case_id in text

    # A bundle that cannot be made is said beside the button; the page stays.
    async def unavailable(route: Route) -> None:
        await route.fulfill(status=503, json={"detail": "the database is unavailable"})

    await page.route(re.compile(r"/cases/[0-9a-f-]+/bundle$"), unavailable)
    await page.get_by_role("button", name="Download evidence bundle").click()
    await expect(page.get_by_role("alert").filter(has_text="could not be made (503)")
                 ).to_be_visible()
    await expect(page.locator("#outcome")).to_be_visible()

    # A legal hold on the case is shown with it.
    await expect(page.locator("#f-hold")).to_have_count(0)
    await pool.execute("INSERT INTO legal_holds (tenant_id, scope, case_id, reason, placed_by) "
                       "SELECT tenant_id, 'case', case_id, 'Complaint 2026-114', 'carol' "
                       "FROM cases WHERE case_id = $1", uuid.UUID(case_id))
    await page.reload()
    await expect(page.locator("#f-hold")).to_have_text("held: kept until released",
                                                       timeout=10_000)

    # A superuser rewrites a tool result in the signed bytes: the page names the event.
    seq = await pool.fetchval(
        "SELECT seq FROM event_log WHERE case_id = $1 AND event_type = 'REACT_CYCLE' "
        "ORDER BY seq LIMIT 1", uuid.UUID(case_id))
    await forge_tool_result(pool, uuid.UUID(case_id), seq)
    await page.reload()
    problems = page.locator(".problems")
    await expect(problems).to_contain_text("This trail does not verify", timeout=10_000)
    await expect(page.locator("#f-integrity")).to_have_text("does not verify")
    altered = page.locator(f"#e-1-{seq}")
    await expect(altered).to_have_class(re.compile(r"\btampered\b"))
    await expect(altered.locator(".problem", has_text="hash_mismatch")).to_be_visible()
    await page.evaluate("window.scrollTo(0, document.querySelector('.problems').offsetTop - 8)")
    await page.screenshot(path=str(DOCS / "viewer-altered.png"))
    await problems.get_by_role("button", name=f"attempt 1, event {seq}").first.click()
    await expect(altered).to_be_focused()
    await page.close()


async def test_an_ended_reviewed_case_does_not_ask_the_review_queue(
    browser: Browser, stack: InProcessStack, lender: httpx.AsyncClient, viewer_key: str,
    pool: asyncpg.Pool,
) -> None:
    """A case that waited for a person and was reviewed: its page shows the wait and the
    review, and never asks ``GET /reviews/{id}`` for a due time (a 404 once it ended)."""
    started = await lender.post("/cases", json={"agent": "loan-officer",
                                                "input": SAMPLE_APPLICATIONS[1]})
    case_id = started.json()["caseId"]
    assert (await ended(lender, case_id))["status"] == "awaiting_review"
    _, key = await ApiKeyStore(pool).create("lender", ("cases:review", "cases:read"),
                                            "viewer reviewer", None, "rita")
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                                 headers={"Authorization": f"Bearer {key}"}) as rita:
        reviewed = await rita.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Income checked by phone."})
        assert reviewed.status_code in (200, 202), reviewed.text
    assert (await ended(lender, case_id, statuses=("awaiting_review",)))["status"] == \
        "completed"
    page = await signed_in(browser, stack, viewer_key, f"/ui/cases/{case_id}")
    await expect(page.locator("#f-integrity")).to_have_text("verified, complete",
                                                            timeout=10_000)
    await expect(page.locator("article.waiting")).to_have_count(1)
    requested: list[str] = page.requested  # type: ignore[attr-defined]
    assert not [url for url in requested if f"/reviews/{case_id}" in url], requested


async def test_a_phone_width_page_has_no_horizontal_scroll_and_a_bad_key_is_refused(
    browser: Browser, stack: InProcessStack, lender: httpx.AsyncClient, viewer_key: str,
) -> None:
    case_id = (await lender.post("/cases", json={"agent": "loan-officer",
                                                 "input": SAMPLE_APPLICATIONS[1]})).json()
    await ended(lender, case_id["caseId"])
    page = await signed_in(browser, stack, viewer_key, f"/ui/cases/{case_id['caseId']}",
                           width=390)
    # A-1002 is referred: the page ends on the answer waiting for a person.
    await expect(page.locator("#waiting")).to_be_visible(timeout=10_000)
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    await page.screenshot(path=str(DOCS / "viewer-phone.png"))
    await page.close()

    refused = await signed_in(browser, stack, "ct_000000000000_" + "A" * 43)
    await expect(refused.get_by_role("alert")).to_contain_text("not accepted")
    await refused.close()


async def test_the_api_docs_load_nothing_from_elsewhere_and_run_under_a_strict_csp(
    browser: Browser, stack: InProcessStack,
) -> None:
    """FastAPI's default /docs and /redoc loaded their scripts from a CDN, with no
    integrity check and no CSP. /docs now comes from the package, under a CSP."""
    page = await browser.new_page()
    requested: list[str] = []
    problems: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.on("console", lambda message: problems.append(message.text)
            if message.type == "error" else None)
    reply = await page.goto(f"{stack.base_url}/docs")
    assert reply is not None and reply.status == 200
    assert "script-src 'self'" in reply.headers["content-security-policy"]
    await expect(page.locator(".swagger-ui .information-container")).to_contain_text(
        "casetrail", timeout=15_000)
    await expect(page.locator(".opblock-summary-path").first).to_be_visible()
    assert all(url.startswith(stack.base_url) for url in requested), requested
    assert not [p for p in problems if "Content Security Policy" in p], problems
    await page.close()
    async with httpx.AsyncClient(base_url=stack.base_url) as anyone:
        assert (await anyone.get("/redoc")).status_code == 404
        assert "cdn" not in (await anyone.get("/docs")).text.lower()


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subject: str


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "decline"]


WRITE_UP = ("**Income** checked against the bureau.\n\n```json\n{\"band\": \"high\"}\n```\n\n"
            "- first reason\n- second reason\n\n"
            "<img src=x onerror=\"window.pwned = 1\"> <script>window.pwned = 2</script>\n\n"
            "[the policy](https://policy.example.test/4.2) and [not this](javascript:"
            "window.pwned=3)")


def write_up(messages: Sequence[ChatMessage]) -> AssistantTurn:
    return AssistantTurn(text=WRITE_UP, tool_calls=(
        call(FINAL_ANSWER, "final", decision="approve"),))


NOTES = Agent(name="markdown-notes", version="1.0.0", description="Writes its reasoning "
              "in Markdown.", instructions="Decide.", input=Note, answer=Verdict, tools=[],
              script=write_up, limits=Limits(max_cycles=2, deadline_seconds=30))


@pytest.fixture
def notes_agent() -> Iterator[str]:
    with registered(NOTES) as name:
        yield name


async def test_reasoning_is_markdown_with_raw_html_shown_as_text(
    browser: Browser, stack: InProcessStack, lender: httpx.AsyncClient, viewer_key: str,
    notes_agent: str,
) -> None:
    case_id = (await lender.post("/cases", json={"agent": notes_agent, "input": {
        "subject": "A-1001"}})).json()["caseId"]
    assert (await ended(lender, case_id))["status"] == "completed"
    page = await signed_in(browser, stack, viewer_key, f"/ui/cases/{case_id}")
    reasoning = page.locator("article.cycle .reasoning.markdown").first
    await expect(reasoning.locator("strong")).to_have_text("Income")
    await expect(reasoning.locator("pre code")).to_contain_text('{"band": "high"}')
    await expect(reasoning.locator("li")).to_have_count(2)
    await expect(reasoning.locator("a")).to_have_attribute(
        "href", "https://policy.example.test/4.2")
    # Raw HTML is text, never markup; a javascript: link is not a link.
    await expect(reasoning).to_contain_text('<img src=x onerror="window.pwned = 1">')
    await expect(reasoning).to_contain_text("<script>window.pwned = 2</script>")
    assert await reasoning.locator("img, script").count() == 0
    assert await reasoning.locator("a[href^='javascript']").count() == 0
    assert await page.evaluate("window.pwned") is None
    await page.close()


async def test_the_list_follows_cases_live_and_a_running_case_is_cancelled_from_its_page(
    browser: Browser, stack: InProcessStack, lender: httpx.AsyncClient, pool: asyncpg.Pool,
) -> None:
    """The list, left open, shows a case started meanwhile and its status changing
    without a reload; a key with cases:cancel cancels a running case from its page, and
    the trail says who."""
    _, key = await ApiKeyStore(pool).create("lender", (*SCOPES, "cases:cancel"),
                                            "viewer canceller")
    page = await signed_in(browser, stack, key, "/ui/")
    await expect(page.locator(".live-list")).to_contain_text("Live")
    slow = {"agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0],
            "model": {"provider": "scripted", "name": "slow", "latencyMs": 700}}
    case_id = (await lender.post("/cases", json=slow)).json()["caseId"]
    row = page.locator(f"tr[data-case-id='{case_id}']")
    await expect(row).to_be_visible(timeout=10_000)
    await expect(row.locator("td.status")).to_have_text("running", timeout=10_000)
    await expect(row.locator("td.cycles")).not_to_have_text("0", timeout=10_000)
    await expect(row.locator("td.status")).to_have_text("completed", timeout=20_000)
    await expect(row.locator("td.decision")).to_have_text("approve")
    # Cancel: another slow case, from its own page.
    case_id = (await lender.post("/cases", json={**slow, "model": {
        "provider": "scripted", "name": "slow", "latencyMs": 2500}})).json()["caseId"]
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await page.goto(f"{stack.base_url}/ui/cases/{case_id}")
    await page.get_by_role("button", name="Cancel case").click()
    outcome = page.locator("#outcome")
    await expect(outcome).to_contain_text("Cancelled", timeout=20_000)
    await expect(outcome).to_contain_text("cancelled in the trail viewer")
    assert await page.get_by_role("button", name="Cancel case").count() == 0
    await page.close()


async def test_a_decisions_reason_codes_read_as_codes(
    browser: Browser, stack: InProcessStack, lender: httpx.AsyncClient, viewer_key: str,
) -> None:
    """A refer's panel read `Reason codes: ,[object HTMLElement] ,[object HTMLElement]`."""
    case_id = (await lender.post("/cases", json={"agent": "loan-officer",
                                                 "input": SAMPLE_APPLICATIONS[1]})
               ).json()["caseId"]
    view = await ended(lender, case_id)
    codes = view["answer"]["reasonCodes"]
    assert codes, view["answer"]
    page = await signed_in(browser, stack, viewer_key, f"/ui/cases/{case_id}")
    shown = page.locator("p.codes").first
    await expect(shown).to_have_text("Reason codes: " + " ".join(codes), timeout=10_000)
    await page.close()


async def test_a_backtest_reads_as_a_matrix_and_a_changed_case_side_by_side(
    browser: Browser, stack: InProcessStack, lender: httpx.AsyncClient, pool: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Maria Okafor's score (742) is approved at 700: a challenger approving from 750
    refers her. The backtest's page shows the matrix and the changed case; the case's
    page puts the recorded trail beside the challenger's run, the differing fields
    marked."""
    case_id = (await lender.post("/cases", json={"agent": "loan-officer",
                                                 "input": SAMPLE_APPLICATIONS[0]})
               ).json()["caseId"]
    assert (await ended(lender, case_id))["answer"]["decision"] == "approve"
    _, key = await ApiKeyStore(pool).create("lender", ("backtests:run", "cases:read"),
                                            "backtest viewer")
    monkeypatch.setattr(loan_officer, "AUTO_APPROVE_SCORE", 750)
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10,
                                 headers={"Authorization": f"Bearer {key}"}) as tester:
        asked = await tester.post("/backtests", json={"agent": "loan-officer",
                                                      "cases": [case_id]})
        assert asked.status_code == 202, asked.text
        backtest_id = asked.json()["backtestId"]
    page = await signed_in(browser, stack, key, "/ui/backtests")
    row = page.locator(f'tr[data-backtest-id="{backtest_id}"]')
    await expect(row).to_be_visible(timeout=10_000)
    await row.get_by_role("link").click()
    await expect(page.locator('td[data-cell="approve>refer"]')).to_have_text("1", timeout=15_000)
    await expect(page.locator("dl.outcomes")).to_contain_text("Decision changed1")
    await expect(page.get_by_role("button", name="Download report (PDF)")).to_be_visible()
    await shown_in_full(page)
    await no_flaws(page)
    await page.screenshot(path=str(DOCS / "viewer-backtest.png"), full_page=True)
    changed = page.locator(f'table.changed tr[data-case-id="{case_id}"]')
    await changed.locator("a.id").click()
    await expect(page.get_by_role("heading", name="Champion, as recorded")).to_be_visible(
        timeout=10_000)
    sides = page.locator(".side-by-side > section")
    await expect(sides.nth(0).locator("article.cycle")).not_to_have_count(0)
    await expect(sides.nth(1).locator("article.cycle")).not_to_have_count(0)
    decided = 'tr.differs[data-field="decision"]'
    await expect(sides.nth(0).locator(decided)).to_contain_text("approve")
    await expect(sides.nth(1).locator(decided)).to_contain_text("refer")
    await page.screenshot(path=str(DOCS / "viewer-backtest-case.png"))
    await shown_in_full(page)
    await no_flaws(page)
    await page.close()
