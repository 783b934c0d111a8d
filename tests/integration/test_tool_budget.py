"""A tool result has a budget: one whose event would exceed the event size limit is
recorded as a tool error naming its size and SHA-256 (the model sees that error), never
published oversized, never a stalled attempt. One near the limit is recorded whole and
the case goes on. On the real stack, its components as processes, with a capability
on the bus and a local tool."""

from __future__ import annotations

import hashlib
import sys
import uuid
from typing import Any

import orjson
import pytest

from casetrail.config import McpServer, Settings
from tests.support.helpers import ended
from tests.support.stack import component_processes, namespace_of_its_own

BULKY = "tests.plugins.bulky:BULKY"
LINE = "The quick brown fox jumps over the lazy dog. 0123456789\n"


def document(size: int) -> dict[str, Any]:
    return {"text": (LINE * (size // len(LINE) + 1))[:size]}


@pytest.fixture(scope="module")
async def bulky_stack(settings: Settings, database: str) -> Any:
    archive = McpServer(name="archive", transport="stdio", timeout_seconds=10, attempts=1,
                        command=[sys.executable, "-m", "tests.plugins.archive_server"])
    async with namespace_of_its_own(settings, "bulky", agents=[BULKY], mcp_servers=[archive],
                                    extra_capabilities=["bulky-document"]) as (own, pool, key), \
            component_processes(own, key) as (client, _):
        yield client, pool


@pytest.mark.parametrize("source", ["capability", "local", "mcp"])
async def test_a_result_over_the_event_budget_is_a_recorded_tool_error(
    bulky_stack: Any, source: str,
) -> None:
    """2 MB: the case completes; its trail records the call as an error naming the
    result's size and SHA-256, and the model saw that error."""
    client, pool = bulky_stack
    size = 2_000_000
    case_id = (await client.post("/cases", json={"agent": "document-digest", "input": {
        "documentBytes": size, "source": source}})).json()["caseId"]
    view = await ended(client, case_id, timeout=60)
    assert view["status"] == "completed", view
    data = orjson.dumps(document(size))  # the result's JSON, as the model would see it
    digest = hashlib.sha256(data).hexdigest()
    assert view["answer"]["receivedBytes"] == 0
    assert digest in view["answer"]["toolError"], view["answer"]
    calls = await pool.fetch(
        "SELECT error, tool_result IS NULL AS no_result FROM react_tool_calls "
        "WHERE case_id = $1", uuid.UUID(case_id))
    assert len(calls) == 1 and calls[0]["no_result"], calls
    assert f"{len(data):,} bytes" in calls[0]["error"] and digest in calls[0]["error"]
    assert (await client.get(f"/cases/{case_id}/verify")).json()["verified"] is True
    stored = await pool.fetchval("SELECT max(octet_length(body)) FROM event_log "
                                 "WHERE case_id = $1", uuid.UUID(case_id))
    assert stored < 64 * 1024


@pytest.mark.parametrize("source", ["capability", "local", "mcp"])
async def test_a_result_within_the_budget_is_recorded_whole_and_the_case_goes_on(
    bulky_stack: Any, source: str,
) -> None:
    """900 KB: recorded whole (the model sees it shortened to its context budget);
    the case completes promptly, in one attempt."""
    client, pool = bulky_stack
    size = 900_000
    case_id = (await client.post("/cases", json={"agent": "document-digest", "input": {
        "documentBytes": size, "source": source}})).json()["caseId"]
    view = await ended(client, case_id, timeout=60)
    assert view["status"] == "completed", view
    assert view["answer"] == {"receivedBytes": 0, "shortened": True, "toolError": None}
    attempts = await pool.fetchval("SELECT max(attempt) FROM event_log WHERE case_id = $1",
                                   uuid.UUID(case_id))
    assert attempts == 1
    stored = await pool.fetchval(
        "SELECT length(tool_result ->> 'text') FROM react_tool_calls WHERE case_id = $1",
        uuid.UUID(case_id))
    assert stored == size
