"""The case report, one PDF per case (real uvicorn, real Postgres, real broker): its
text says the decision, checks, reviewer, every cycle and integrity; it embeds the
evidence bundle whose SHA-256 it prints, and that bundle verifies offline; it is logged
as an export, shows sensitive values only for pii:read, and a busy API answers 429."""

from __future__ import annotations

import asyncio
import hashlib
import io
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pypdf

from casetrail.adapters.store import ApiKeyStore
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.cases import reporting
from casetrail.config import Settings
from casetrail.contract.integrity import public_key_text
from casetrail.trail.keyfile import worker_signer
from tests.support.browser import DOCS
from tests.support.cli import check_bundle, run_cli
from tests.support.helpers import ended, wait_until
from tests.support.stack import InProcessStack, module_stack

stack = module_stack(worker_concurrency=4)
TENANT = "reports"
REFERRED = SAMPLE_APPLICATIONS[1]  # A-1002, Daniel Reyes: the loan officer refers it


def read(pdf: bytes) -> tuple[str, dict[str, bytes]]:
    """The PDF's text (every page) and its attached files."""
    reader = pypdf.PdfReader(io.BytesIO(pdf))
    text = "\n".join(page.extract_text() for page in reader.pages)
    return text, {name: data[0] for name, data in reader.attachments.items()}


async def client(stack: InProcessStack, pool: asyncpg.Pool, scopes: tuple[str, ...],
                 person: str | None = None) -> httpx.AsyncClient:
    _, key = await ApiKeyStore(pool).create(TENANT, scopes, f"report {person or 'reader'}",
                                            None, person)
    return httpx.AsyncClient(base_url=stack.base_url, timeout=30,
                             headers={"Authorization": f"Bearer {key}"})


async def test_a_reviewed_case_reports_as_one_pdf_that_carries_its_own_evidence(
    stack: InProcessStack, pool: asyncpg.Pool, settings: Settings, tmp_path: Path,
) -> None:
    starter = await client(stack, pool, ("cases:start", "cases:read"), "sam")
    reviewer = await client(stack, pool, ("cases:review", "cases:read"), "rita")
    auditor = await client(stack, pool, ("cases:read", "pii:read"))
    async with starter, reviewer, auditor:
        case_id = (await starter.post("/cases", json={"agent": "loan-officer",
                                                      "input": REFERRED})).json()["caseId"]
        assert (await ended(starter, case_id, timeout=30))["status"] == "awaiting_review"
        reply = await reviewer.post(f"/cases/{case_id}/review", json={
            "verdict": "confirm", "reason": "Thin file: a person takes it."})
        assert reply.status_code == 202, reply.text

        async def completed() -> bool:
            return bool((await starter.get(f"/cases/{case_id}")).json()["status"]
                        == "completed")

        await wait_until(completed, 30)
        reply = await starter.get(f"/cases/{case_id}/report")
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"] == "application/pdf"
        text, attached = read(reply.content)
        clear, _ = read((await auditor.get(f"/cases/{case_id}/report")).content)
    flat = " ".join(text.split())
    for expected in ("Case report", case_id, "loan-officer", "Decision refer",
                     "Decided by reviewer", "confirm by rita (via key",
                     "Thin file: a person takes it.", "names-the-applicant",
                     "verified, complete", "REACT_CYCLE", "tool credit-score (worker)",
                     "CASE_AWAITING_REVIEW", "casetrail verify-bundle"):
        assert expected in flat, (expected, flat[:3000])
    # The embedded bundle: its SHA-256 is the one printed, and it verifies offline.
    (name, bundle), = attached.items()
    assert name == f"casetrail-{case_id}.bundle.json"
    digest = hashlib.sha256(bundle).hexdigest()
    assert digest in flat.replace(" ", "") and reply.headers["x-casetrail-bundle-sha256"] \
        == digest
    path = tmp_path / name
    path.write_bytes(bundle)
    checked = await asyncio.to_thread(check_bundle, settings, path,
                                      public_key_text(worker_signer(settings).public_key))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Sensitive values: placeholders for the starter, the name for pii:read.
    assert "Daniel Reyes" not in flat and "[pii:applicantName]" in flat
    assert "Daniel Reyes" in clear
    # A report is an export, logged like one.
    logged = await pool.fetchval("SELECT count(*) FROM access_log WHERE case_id = $1::uuid "
                                 "AND action = 'export'", case_id)
    assert logged >= 2
    # From a terminal, as the operator.
    written = tmp_path / "report.pdf"
    made = await asyncio.to_thread(run_cli, settings, "report", case_id, "-o", str(written))
    assert made.returncode == 0, made.stderr
    assert "SHA-256" in made.stderr and read(written.read_bytes())[0].startswith("Case report")
    if shutil.which("pdftoppm"):  # the picture of page 1 in docs/ (poppler-utils)
        await asyncio.to_thread(subprocess.run, [
            "pdftoppm", "-png", "-r", "80", "-f", "1", "-l", "1", "-singlefile", str(written),
            str(DOCS / "report-page1")], check=True)


async def test_reports_render_a_few_at_once_and_a_busy_api_answers_429(
    stack: InProcessStack, pool: asyncpg.Pool,
) -> None:
    reader = await client(stack, pool, ("cases:start", "cases:read"))
    async with reader:
        case_id = (await reader.post("/cases", json={"agent": "loan-officer", "input":
                                                     SAMPLE_APPLICATIONS[0]})).json()["caseId"]
        await ended(reader, case_id, timeout=30)
        held = [await _hold() for _ in range(reporting.RENDERING_AT_ONCE)]
        try:
            busy = await reader.get(f"/cases/{case_id}/report")
        finally:
            for release in held:
                release()
        assert busy.status_code == 429, busy.text
        assert busy.headers["retry-after"] == "2"
        assert busy.headers["content-type"] == "application/problem+json"
        assert (await reader.get(f"/cases/{case_id}/report")).status_code == 200
        assert (await reader.get(f"/cases/{uuid.uuid4()}/report")).status_code == 404


async def _hold() -> Any:
    await reporting._rendering.acquire()
    return reporting._rendering.release


async def test_without_the_pdf_part_the_report_answers_501_naming_what_to_install(
    stack: InProcessStack, pool: asyncpg.Pool, monkeypatch: Any,
) -> None:
    """A deployment installed without ``casetrail[pdf]`` (simulated: fpdf cannot be
    imported) serves everything else; the report says what it lacks."""
    reader = await client(stack, pool, ("cases:start", "cases:read"))
    async with reader:
        case_id = (await reader.post("/cases", json={"agent": "loan-officer", "input":
                                                     SAMPLE_APPLICATIONS[0]})).json()["caseId"]
        await ended(reader, case_id, timeout=30)
        monkeypatch.setitem(sys.modules, "fpdf", None)
        lacking = await reader.get(f"/cases/{case_id}/report")
        assert lacking.status_code == 501, lacking.text
        assert lacking.headers["content-type"] == "application/problem+json"
        assert "pip install 'casetrail[pdf]'" in lacking.json()["detail"]
        assert (await reader.get(f"/cases/{case_id}")).status_code == 200
        assert (await reader.get(f"/cases/{uuid.uuid4()}/report")).status_code == 404
        monkeypatch.delitem(sys.modules, "fpdf")
        assert (await reader.get(f"/cases/{case_id}/report")).status_code == 200
