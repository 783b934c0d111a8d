"""A plugin agent installed as a package runs end to end, its worker tool on the bus."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from casetrail.config import Settings
from tests.support.helpers import ended
from tests.support.stack import (
    component_processes,
    namespace_of_its_own,
)

OVERDRAFT = "tests.plugins.overdraft:OVERDRAFT"

REQUEST = {"accountId": "ACC-1230", "holderName": "Jo Bloggs", "requestedLimit": 500}


@pytest.fixture(scope="module")
async def plugin_stack(settings: Settings, database: str) -> Any:
    """API, worker, consumer and capability worker as processes of a namespace whose
    deployment names the plugin in CASETRAIL_AGENTS (setup gives its capability a queue
    and a user of its own)."""
    async with namespace_of_its_own(settings, "plugin", agents=[OVERDRAFT],
                                    extra_capabilities=["overdraft-history"]) as (own, pool, key), \
            component_processes(own, key) as (client, _):
        yield client, pool


async def test_a_plugin_agent_runs_end_to_end_with_its_worker_tool_on_the_bus(
    plugin_stack: Any,
) -> None:
    client, pool = plugin_stack
    offered = {a["name"]: a for a in (await client.get("/agents")).json()["agents"]}
    assert offered["overdraft-review"]["version"] == "0.3.0"
    assert offered["overdraft-review"]["inputSchema"]["properties"]["holderName"][
        "x-casetrail-sensitive"] is True
    bad = await client.post("/cases", json={"agent": "overdraft-review",
                                            "input": {**REQUEST, "requestedLimit": -1}})
    assert bad.status_code == 422 and ["body", "input", "requestedLimit"] in [
        e["loc"] for e in bad.json()["errors"]]
    case_id = (await client.post("/cases", json={"agent": "overdraft-review",
                                                 "input": REQUEST})).json()["caseId"]
    view = await ended(client, case_id, timeout=30)
    assert view["status"] == "completed", view
    assert view["answer"] == {"decision": "approve", "bouncedPayments12m": 0, "monthlyFee": 10}
    trail = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    assert trail[-1]["payload"]["checks"] == [{
        "name": "history-consulted", "version": "1", "passed": True, "blocking": True,
        "detail": "the history was consulted"}, {
        "name": "history-of-the-holder", "version": "1", "passed": True, "blocking": True,
        "detail": "the holder's own history"}]
    calls = await pool.fetch(
        "SELECT tool_name, tool_source, tool_args::text AS args FROM react_tool_calls "
        "WHERE case_id = $1 ORDER BY cycle_index, call_index", uuid.UUID(case_id))
    assert [(c["tool_name"], c["tool_source"]) for c in calls] == [
        ("overdraft-history", "worker"), ("monthly-fee", "local")]
    assert "Jo Bloggs" not in calls[0]["args"] and "[pii:holderName]" in calls[0]["args"]
    assert (await client.get(f"/cases/{case_id}/verify")).json()["verified"] is True
    await asyncio.sleep(0)  # (the stack stops cleanly in the fixture)
