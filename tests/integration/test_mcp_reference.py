"""An official reference MCP server nobody here wrote — ``mcp-server-time`` from PyPI,
installed into the project's own environment beside casetrail (one environment, one
MCP SDK) — is started by the capability worker over stdio and called from a case: the
call is on the record with its server, tool and schema digest, and the trail verifies.
An agent that names a server not configured, or a tool the server does not serve, is
refused loudly: by ``POST /cases``, ``casetrail agents`` and ``casetrail check``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from casetrail.config import McpServer, Settings
from casetrail.mcp import McpRequest
from casetrail.mcp.session import ServerSession
from tests.support.helpers import ended
from tests.support.stack import component_processes, namespace_of_its_own

CLOCK = "tests.plugins.clock:CLOCK"
UNSERVED = "tests.plugins.clock:UNSERVED"
MISSPELT = "tests.plugins.clock:MISSPELT"
TIME = McpServer(name="time", transport="stdio", timeout_seconds=10, attempts=2,
                 command=[sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"])


@pytest.fixture(scope="module")
async def clock_stack(settings: Settings, database: str) -> AsyncIterator[Any]:
    async with namespace_of_its_own(settings, "clock", agents=[CLOCK, UNSERVED],
                                    mcp_servers=[TIME]) as (own, _pool, key), \
            component_processes(own, key) as (client, _):
        yield client


async def test_a_case_calls_the_official_time_server_over_stdio(clock_stack: Any) -> None:
    assert int(version("mcp").split(".")[0]) >= 2  # the server and casetrail share one SDK
    client = clock_stack
    started = await client.post("/cases", json={"agent": "world-clock",
                                                "input": {"timezone": "Asia/Tokyo"}})
    assert started.status_code == 202, started.text
    case_id = started.json()["caseId"]
    view = await ended(client, case_id, timeout=60)
    assert view["status"] == "completed", view
    assert view["answer"]["timezone"] == "Asia/Tokyo" and view["answer"]["error"] is None
    told = datetime.fromisoformat(view["answer"]["datetime"])
    assert told.utcoffset() == timedelta(hours=9)
    events = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    [offered] = events[0]["payload"]["mcpCatalogs"]  # read by the worker before the case
    assert offered["server"] == "time" and offered["stale"] is False, offered
    assert offered["ageSeconds"] >= 0 and "notServed" not in offered
    call = next(c for e in events if e["eventType"] == "REACT_CYCLE"
                for c in e["payload"]["toolCalls"])
    assert call["toolName"] == "time_get_current_time" and call.get("error") is None
    assert call["mcp"]["server"] == "time" and call["mcp"]["tool"] == "get_current_time"
    assert len(call["mcp"]["schemaDigest"]) == 64
    assert call["toolResult"]["timezone"] == "Asia/Tokyo"
    verified = (await client.get(f"/cases/{case_id}/verify")).json()
    assert verified["verified"] is True, verified


async def test_a_case_for_an_agent_whose_server_is_not_configured_is_refused(
    clock_stack: Any,
) -> None:
    """Never a case that quietly lacks its tools: a problem naming the agent, its tool
    and the server the deployment does not configure."""
    refused = await clock_stack.post("/cases", json={"agent": "weather-clock",
                                                     "input": {"timezone": "UTC"}})
    assert refused.status_code == 422, refused.text
    [issue] = refused.json()["errors"]
    assert issue["loc"] == ["body", "agent"], issue
    assert "'weather-clock' is not configured to run here" in issue["msg"]
    assert "MCP server 'weather', which CASETRAIL_MCP_SERVERS does not configure " \
        "(it configures: time)" in issue["msg"]


def _cli(settings: Settings, *args: str, agents: list[str]) -> subprocess.CompletedProcess[str]:
    own = settings.model_copy(update={"agents": agents, "mcp_servers": [TIME]})
    return subprocess.run([sys.executable, "-m", "casetrail.cli", *args],
                          env=own.environment(), capture_output=True, text=True, timeout=60,
                          check=False)


def test_the_cli_refuses_misconfigured_agents_naming_each_reason(settings: Settings) -> None:
    listed = _cli(settings, "agents", agents=[CLOCK, UNSERVED])
    assert listed.returncode == 1, listed.stderr
    assert "agent world-clock 1.0.0" in listed.stdout
    assert "'weather-clock' is not configured to run here: tool 'weather_forecast' names " \
        "the MCP server 'weather'" in listed.stderr
    checked = _cli(settings, "check", agents=[CLOCK, MISSPELT])
    assert checked.returncode == 1, checked.stderr
    assert "'misspelt-clock' is not configured to run here: tool 'time_get_time': the MCP " \
        "server 'time' does not serve 'get_time' (it serves: convert_time, " \
        "get_current_time)" in checked.stderr
    assert "world-clock" not in checked.stderr
    passed = _cli(settings, "check", agents=[CLOCK])
    assert passed.returncode == 0, passed.stderr
    assert "agents can run as configured" in passed.stdout


OLD_SERVER = '''
from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

server = FastMCP("old")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def echo(text: str) -> str:
    """Says the text back."""
    return f"echo: {text}"


server.run()
'''


def _old_environment(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "mcp>=1.25,<2"],
                   check=True, timeout=600, capture_output=True)


async def test_a_server_on_the_sdks_1x_line_in_its_own_environment_still_serves(
    tmp_path: Path,
) -> None:
    """A team's older server, built on the SDK's 1.x line, stays in an environment of its
    own (pip, from the registry): casetrail's 2.x client negotiates a 2025 protocol
    version with it, reads its catalog and calls its tool."""
    venv = tmp_path / "old-server"
    await asyncio.to_thread(_old_environment, venv)
    script = tmp_path / "old_server.py"
    script.write_text(OLD_SERVER)
    session = ServerSession(McpServer(name="old", transport="stdio", timeout_seconds=20,
                                      command=[str(venv / "bin" / "python"), str(script)]))
    try:
        catalog = await session.catalog()
        [tool] = catalog.tools
        assert (tool.name, tool.retryable, catalog.stale) == ("echo", True, False)
        said = await session.call(McpRequest(op="call", tool="echo", arguments={"text": "hi"},
                                             schema_digest=tool.schema_digest))
        assert said == {"result": "echo: hi"}  # its structuredContent
        assert session.protocol_version is not None
        assert session.protocol_version.startswith("2025-")
    finally:
        await session.close()
