"""Every MCP content type on the record: a tool whose result is a caption, a PNG, an
embedded text resource, audio, an embedded binary resource and a resource link is
recorded block by block — binaries as media type, size and SHA-256 with their bytes —
the model is shown the binaries by their digest, not their base64, the trail verifies,
the report names each binary by its digest, and the viewer draws the image and names
the other binaries (in Chromium)."""

from __future__ import annotations

import base64
import hashlib
import io
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from playwright.async_api import Browser, expect
from pypdf import PdfReader

from casetrail.config import McpServer, Settings
from tests.plugins.archive_server import CHIRP, PIXEL
from tests.support.helpers import ended
from tests.support.stack import component_processes, namespace_of_its_own


@pytest.fixture(scope="module")
async def exhibit_stack(settings: Settings, database: str) -> AsyncIterator[Any]:
    archive = McpServer(name="archive", transport="stdio", timeout_seconds=10, attempts=2,
                        command=[sys.executable, "-m", "tests.plugins.archive_server"])
    async with namespace_of_its_own(settings, "exhibits", agents=[
            "tests.plugins.exhibits:EXHIBITS"], mcp_servers=[archive]) as (own, _pool, key), \
            component_processes(own, key) as (client, _):
        yield client, key


def digest(data: str) -> str:
    return hashlib.sha256(base64.b64decode(data)).hexdigest()


async def test_every_content_type_is_on_the_record(exhibit_stack: Any, browser: Browser
                                                   ) -> None:
    client, key = exhibit_stack
    started = await client.post("/cases", json={"agent": "exhibit-reader",
                                                "input": {"number": 7}})
    assert started.status_code == 202, started.text
    case_id = started.json()["caseId"]
    view = await ended(client, case_id, timeout=60)
    assert view["status"] == "completed", view
    assert view["answer"] == {"blocks": 6, "saw_bytes": False}  # digests, not base64
    events = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    [call] = [c for e in events if e["eventType"] == "REACT_CYCLE"
              for c in e["payload"]["toolCalls"]]
    text, image, transcript, audio, original, link = call["toolResult"]
    assert text == {"type": "text", "text": "Exhibit 7: the damaged kitchen."}
    assert image == {"type": "image", "mimeType": "image/png", "data": PIXEL,
                     "bytes": len(base64.b64decode(PIXEL)), "sha256": digest(PIXEL)}
    assert transcript == {"type": "resource", "uri": "archive://exhibits/7/transcript",
                          "mimeType": "text/plain",
                          "text": "Claimant: the fire started at the stove."}
    assert audio["type"] == "audio" and audio["sha256"] == digest(CHIRP)
    assert original == {"type": "resource", "uri": "archive://exhibits/7/original",
                        "mimeType": "application/pdf", "data": "JVBERi0xLjQK", "bytes": 9,
                        "sha256": hashlib.sha256(b"%PDF-1.4\n").hexdigest()}
    assert link == {"type": "resource_link", "uri": "https://archive.example/exhibits/7.tiff",
                    "name": "full scan", "mimeType": "image/tiff", "description": "600 dpi"}
    assert (await client.get(f"/cases/{case_id}/verify")).json()["verified"] is True
    report = await client.get(f"/cases/{case_id}/report")
    assert report.status_code == 200, report.text
    pdf = " ".join(page.extract_text() for page in PdfReader(io.BytesIO(report.content)).pages)
    flat = "".join(pdf.split())  # the report wraps long lines anywhere
    assert digest(PIXEL) in flat and "full scan" in pdf
    assert PIXEL[:24] not in flat  # the bytes are named by their digest, not printed
    await _the_viewer_shows_them(browser, str(client.base_url), key, case_id)


async def _the_viewer_shows_them(browser: Browser, base_url: str, key: str, case_id: str
                                 ) -> None:
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await page.goto(f"{base_url}/ui/cases/{case_id}")
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    blocks = page.locator(".tool .blocks")
    await expect(blocks).to_contain_text("Exhibit 7: the damaged kitchen.", timeout=15_000)
    image = blocks.locator("figure img")
    await expect(image).to_have_count(1)
    assert await image.evaluate("img => img.complete && img.naturalWidth") == 1  # drawn
    await expect(blocks).to_contain_text(f"audio · audio/wav · 44 bytes · sha256 {digest(CHIRP)}")
    await expect(blocks).to_contain_text("resource archive://exhibits/7/transcript (text/plain)")
    await expect(blocks).to_contain_text("application/pdf · 9 bytes")
    await expect(blocks).to_contain_text("https://archive.example/exhibits/7.tiff full scan")
    text = await page.locator("body").inner_text()
    for flaw in ("[object", "undefined", "NaN", PIXEL[:24]):
        assert flaw not in text, flaw
    await page.close()
