"""MCP servers as WorkerTools: the example project (examples/claims-triage), installed
with pip beside casetrail, runs a case through RabbitMQ and Postgres with a tool of its
own MCP server (the official SDK on both ends), over stdio and over Streamable HTTP; a
server killed mid-case is retried on the record and the case completes once it is back.
The engine's side (names, schemas, retries) runs against the same real server."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from pypdf import PdfReader

from casetrail.config import McpServer, Settings
from casetrail.engine.chat import ToolCallRequest
from casetrail.engine.tools import InProcessWorkerRuntime, ToolBox, WorkerTool, mcp_tool_name
from casetrail.mcp import STARTUP_READ_SECONDS, Catalogs
from casetrail.mcp.capabilities import mcp_capabilities
from tests.support import ROOT
from tests.support.helpers import ended, wait_until
from tests.support.stack import (
    component_processes,
    free_port,
    namespace_of_its_own,
    port_open,
)

EXAMPLE = ROOT / "examples" / "claims-triage"
CLAIM = {"claimId": "CLM-00042", "policyNumber": "POL-100001", "claimantName": "Ada Lovelace",
         "amount": 3_000, "cause": "fire"}
SERVER_MODULE = "claims_triage.policy_server"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example project as pip installs it: a directory to put on PYTHONPATH."""
    source = tmp_path_factory.mktemp("claims-triage-source") / "claims-triage"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__"))  # pip builds in the copy, not the checkout
    target = tmp_path_factory.mktemp("claims-triage")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(source)],
                   check=True, timeout=600, capture_output=True)
    return target


def stdio_policies(**overrides: Any) -> dict[str, Any]:
    return {"name": "policies", "transport": "stdio",
            "command": [sys.executable, "-m", SERVER_MODULE],
            "env": {"PYTHONPATH": "PYTHONPATH"}, "timeoutSeconds": 8, "attempts": 4,
            **overrides}


class Stack:
    def __init__(self, client: httpx.AsyncClient, pool: asyncpg.Pool,
                 children: dict[str, subprocess.Popen[bytes]], own: Settings,
                 example: Path) -> None:
        self.client, self.pool, self.children = client, pool, children
        self.own, self.example = own, example

    async def run(self, claim: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        started = await self.client.post("/cases", json={"agent": "claims-triage",
                                                         "input": claim})
        assert started.status_code == 202, started.text
        case_id = started.json()["caseId"]
        view = await ended(self.client, case_id, timeout=60)
        trail = (await self.client.get(f"/cases/{case_id}/events")).json()["events"]
        return view, trail


async def stack_of(settings: Settings, example: Path, suffix: str, server: dict[str, Any],
                   **env: str) -> AsyncIterator[Stack]:
    """API, worker, consumer and capability worker as processes of a namespace whose
    deployment has the example installed and the policy server configured."""
    async with namespace_of_its_own(settings, suffix, mcp_servers=[McpServer(**server)],
                                    extra_capabilities=["claims-history"]) as (own, pool, key), \
            component_processes(own, key, PYTHONPATH=str(example), **env) as (client, children):
        yield Stack(client, pool, children, own, example)


@pytest.fixture(scope="module")
async def stdio_stack(settings: Settings, database: str, example: Path
                      ) -> AsyncIterator[Stack]:
    async for stack in stack_of(settings, example, "mcp", stdio_policies()):
        yield stack


def servers_under(parent: int) -> list[int]:
    """The policy servers a process started (its children running the server module)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and SERVER_MODULE in command:
            found.append(int(entry.name))
    return found


async def test_the_example_agent_runs_end_to_end_with_its_mcp_tool_and_verifies(
    stdio_stack: Stack,
) -> None:
    client = stdio_stack.client
    offered = {a["name"]: a for a in (await client.get("/agents")).json()["agents"]}
    assert {"name": "policies_coverage", "source": "worker", "description":
            "coverage (from the MCP server policies)",
            "mcp": {"server": "policies", "tool": "coverage"}} in offered["claims-triage"]["tools"]
    view, trail = await stdio_stack.run(CLAIM)
    assert view["status"] == "completed", view
    assert view["answer"] == {"decision": "pay", "payout": 2_500,
                              "reason": "covered, deductible applied"}
    started = trail[0]["payload"]
    # The model was offered the server's own description and schema, by digest.
    offer = next(t for t in started["toolsOffered"] if t["name"] == "policies_coverage")
    assert offer["source"] == "worker" and offer["description"].startswith("The policy's "
                                                                           "coverage")
    calls = trail[1]["payload"]["toolCalls"]
    coverage = next(c for c in calls if c["toolName"] == "policies_coverage")
    assert coverage["toolSource"] == "worker"
    assert coverage["mcp"] == {"server": "policies", "tool": "coverage",
                               "schemaDigest": offer["inputSchemaDigest"]}
    assert coverage["toolResult"]["coverageLimit"] == 20_000  # the structured content
    # The claimant's name reached the server (it says the claimant holds the policy),
    # sealed to mcp-policies; the trail holds only its placeholder.
    assert coverage["toolResult"]["holderMatches"] is True
    assert coverage["toolArgs"]["claimant_name"] == "[pii:claimantName]"
    assert "Ada Lovelace" not in str(trail)
    assert [a["outcome"] for a in coverage["attempts"]] == ["ok"]
    assert next(c for c in calls if c["toolName"] == "claims-history")["toolSource"] == "worker"
    verified = (await client.get(f"/cases/{view['caseId']}/verify")).json()
    assert verified["verified"] is True, verified
    report = await client.get(f"/cases/{view['caseId']}/report")
    text = " ".join(page.extract_text() for page in PdfReader(io.BytesIO(report.content)).pages)
    assert "MCP server policies, tool coverage" in " ".join(text.split())
    stored = await stdio_stack.pool.fetchval(
        "SELECT count(*) FROM react_tool_calls WHERE case_id = $1 AND tool_name = "
        "'policies_coverage' AND tool_source = 'worker'", uuid.UUID(view["caseId"]))
    assert stored == 1


async def test_replay_answers_the_mcp_call_as_it_was_answered(stdio_stack: Stack) -> None:
    """``casetrail replay`` answers the server's call from the record, through the rule
    every tool kind is answered by: the unchanged agent decides the claim the same."""
    view, _ = await stdio_stack.run(CLAIM)
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "casetrail.cli", "replay", view["caseId"]],
        env=stdio_stack.own.environment(PYTHONPATH=str(stdio_stack.example)),
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "same" in done.stdout and "diverged" not in done.stdout, done.stdout


async def test_an_mcp_server_killed_mid_case_is_retried_and_the_case_completes(
    stdio_stack: Stack,
) -> None:
    """The server dies after the case was offered its tools and before the call: the
    capability worker starts it again, and the record shows the failed attempt."""
    await stdio_stack.run(CLAIM)  # the session is open, the catalog read
    capability = stdio_stack.children["capability"].pid
    servers = servers_under(capability)
    assert len(servers) == 1, servers
    os.kill(servers[0], signal.SIGKILL)
    view, trail = await stdio_stack.run({**CLAIM, "claimId": "CLM-00043"})
    assert view["status"] == "completed", view
    coverage = next(c for c in trail[1]["payload"]["toolCalls"]
                    if c["toolName"] == "policies_coverage")
    outcomes = [a["outcome"] for a in coverage["attempts"]]
    assert outcomes[-1] == "ok" and "error" in outcomes[:-1], coverage["attempts"]
    assert "the MCP server policies is unavailable" in coverage["attempts"][0]["error"]
    assert coverage["toolResult"]["deductible"] == 500
    assert (await stdio_stack.client.get(f"/cases/{view['caseId']}/verify")
            ).json()["verified"] is True
    new = servers_under(capability)
    assert len(new) == 1 and new != servers  # started again by the capability worker


def start_http_server(example: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", SERVER_MODULE, "--http", str(port), "--token-env",
         "POLICIES_TOKEN"],
        env={**os.environ, "PYTHONPATH": str(example), "POLICIES_TOKEN": "s3cret"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class HttpServer:
    """The example's policy server over Streamable HTTP (token ``s3cret``), as its own
    process, which a test may kill and start again."""

    def __init__(self, example: Path) -> None:
        self.example, self.port = example, free_port()
        self.process = start_http_server(example, self.port)

    def settings(self, **overrides: Any) -> dict[str, Any]:
        return {"name": "policies", "transport": "http",
                "url": f"http://127.0.0.1:{self.port}/mcp",
                "headersEnv": {"Authorization": "POLICIES_AUTH"}, **overrides}

    async def listening(self) -> None:
        await wait_until(lambda: port_open(self.port), timeout=20, interval=0.2)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def start(self) -> None:
        self.process = start_http_server(self.example, self.port)


@pytest.fixture
async def http_server(example: Path) -> AsyncIterator[HttpServer]:
    server = HttpServer(example)
    try:
        await server.listening()
        yield server
    finally:
        server.kill()


async def test_over_http_with_its_credential_and_through_a_restart(
    settings: Settings, database: str, example: Path, http_server: HttpServer,
) -> None:
    async for stack in stack_of(settings, example, "mcphttp",
                                http_server.settings(timeoutSeconds=4, attempts=10),
                                POLICIES_AUTH="Bearer s3cret"):
        view, _ = await stack.run(CLAIM)
        assert view["status"] == "completed", view  # the credential was taken
        http_server.kill()
        pending = asyncio.create_task(stack.run({**CLAIM, "claimId": "CLM-00044"}))
        await asyncio.sleep(3)  # the first attempt fails while it is down
        http_server.start()
        view, trail = await pending
        assert view["status"] == "completed", view
        coverage = next(c for c in trail[1]["payload"]["toolCalls"]
                        if c["toolName"] == "policies_coverage")
        outcomes = [a["outcome"] for a in coverage["attempts"]]
        assert outcomes[-1] == "ok" and len(outcomes) > 1, coverage["attempts"]
        assert (await stack.client.get(f"/cases/{view['caseId']}/verify")
                ).json()["verified"] is True


async def test_a_dead_server_holds_no_case_and_the_trail_names_its_stale_catalog(
    settings: Settings, database: str, example: Path, http_server: HttpServer,
) -> None:
    """The server dies while cases keep starting: no start waits on it (the worker
    offers the catalog it has, read again in the background); once the worker has read
    it as down, CASE_STARTED names the stale catalog and why, and the call fails at once
    (the circuit is open), never after its timeout and every retry."""
    async for stack in stack_of(settings, example, "mcpdown",
                                http_server.settings(timeoutSeconds=10, attempts=4),
                                POLICIES_AUTH="Bearer s3cret", CASETRAIL_MCP_CATALOG_SECONDS="1"):
        view, trail = await stack.run(CLAIM)
        assert view["status"] == "completed", view
        [offered] = trail[0]["payload"]["mcpCatalogs"]
        assert offered["server"] == "policies" and offered["stale"] is False, offered
        assert 0 <= offered["ageSeconds"] < 60 and "problem" not in offered
        http_server.kill()
        for number in range(46, 56):  # until the worker has read it as down
            view, trail = await stack.run({**CLAIM, "claimId": f"CLM-000{number}"})
            [offered] = trail[0]["payload"]["mcpCatalogs"]
            if offered["stale"]:
                break
            await asyncio.sleep(0.5)
        assert offered["stale"] is True, offered
        assert "Connect" in offered["problem"] or "closed" in offered["problem"], offered
        assert offered["readAt"] < trail[0]["occurredAt"]  # the last catalog, offered
        started = datetime.fromisoformat(trail[0]["occurredAt"]) - datetime.fromisoformat(
            view["createdAt"])
        assert started < timedelta(seconds=5), started  # it did not wait the 10 s timeout
        coverage = next(c for c in trail[1]["payload"]["toolCalls"]
                        if c["toolName"] == "policies_coverage")
        assert "circuit open" in coverage["error"], coverage
        assert view["status"] == "awaiting_review", view  # the brain decided without it


async def test_a_wrong_credential_is_a_tool_failure_the_model_sees(
    settings: Settings, database: str, example: Path, http_server: HttpServer,
) -> None:
    """A server that refuses casetrail (here: the wrong token) fails the tool, not the
    worker: the case goes on and the brain decides with what it has."""
    async for stack in stack_of(settings, example, "mcpauth",
                                http_server.settings(timeoutSeconds=5, attempts=1),
                                POLICIES_AUTH="Bearer wrong"):
        view, trail = await stack.run(CLAIM)
        assert view["status"] == "awaiting_review", view  # investigate: a person looks
        coverage = trail[1]["payload"]["toolCalls"][0]
        assert coverage["toolName"] == "policies_coverage"
        assert "could not be reached when this case started" in coverage["error"]
        assert "401" in coverage["error"], coverage["error"]


# The engine's side, against the real server over stdio (in process, no bus).

def test_model_facing_names_are_what_every_provider_accepts() -> None:
    assert mcp_tool_name("claims-db", "get.policy/v2") == "claims-db_get_policy_v2"
    long_a, long_b = mcp_tool_name("s", "x" * 80 + "a"), mcp_tool_name("s", "x" * 80 + "b")
    assert len(long_a) == 64 and long_a != long_b


@pytest.fixture
async def served(example: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[tuple[ToolBox, InProcessWorkerRuntime]]:
    monkeypatch.setenv("CASETRAIL_TEST_EXAMPLE_PATH", str(example))
    capabilities = mcp_capabilities([McpServer(**stdio_policies(
        env={"PYTHONPATH": "CASETRAIL_TEST_EXAMPLE_PATH"}))])
    runtime = InProcessWorkerRuntime({c.name: c for c in capabilities})
    from casetrail import McpTool

    # As a worker starts: the server's first catalog is read before a case is offered
    # anything (a Python server takes seconds to start on a loaded machine, beyond the
    # first read's two seconds that a case start waits).
    catalogs = Catalogs(runtime)
    catalogs.warm(["policies"])
    await catalogs.settled(STARTUP_READ_SECONDS)
    tools = await catalogs.resolve([McpTool("policies", "coverage"),
                                             McpTool("policies", "open_investigation"),
                                             McpTool("policies", "no_such_tool")])
    try:
        yield ToolBox(tools, runtime), runtime
    finally:
        for capability in capabilities:
            assert capability.close is not None
            await capability.close()


async def test_the_catalog_decides_what_is_offered_and_what_is_retried(
    served: tuple[ToolBox, InProcessWorkerRuntime],
) -> None:
    box, _ = served
    offered = {spec.name: spec for spec in box.specs}
    assert sorted(offered) == ["policies_coverage", "policies_open_investigation"]
    assert offered["policies_coverage"].parameters["required"] == ["policy_number",
                                                                   "claimant_name"]
    tools = {t.name: t for t in box._tools.values() if isinstance(t, WorkerTool)}
    assert tools["policies_coverage"].mcp is not None
    assert tools["policies_coverage"].mcp.retryable is True  # readOnlyHint
    assert tools["policies_open_investigation"].mcp is not None
    assert tools["policies_open_investigation"].mcp.retryable is False


async def test_a_backtest_asks_live_only_the_tools_the_server_says_change_nothing(
    served: tuple[ToolBox, InProcessWorkerRuntime],
) -> None:
    """Under the tool policy ``live``, a backtest may ask the server what the record
    lacks only for a tool annotated ``readOnlyHint`` (coverage), never for one that is
    not (open_investigation), though one capability serves both; and a recorded call
    answers only the tool it was made to, not another of the server's with the same
    arguments."""
    from casetrail.audit.backtest import NOT_IN_RECORD, RecordedAnswers

    box, runtime = served
    tools = list(box._tools.values())
    assert {t.name: t.read_only for t in tools if isinstance(t, WorkerTool)} == {
        "policies_coverage": True, "policies_open_investigation": False}
    ada = {"policy_number": "POL-100001", "claimant_name": "Ada Lovelace"}
    recorded: list[Mapping[str, Any]] = [{
        "toolName": "policies_open_investigation", "toolArgs": ada,
        "toolResult": {"investigation": "INV-00001"}, "toolSource": "worker",
        "mcp": {"server": "policies", "tool": "open_investigation", "schemaDigest": "0" * 64}}]
    answers = RecordedAnswers(tools, recorded, live=runtime)
    backtest = ToolBox(tools, answers)
    before = len(runtime.calls)
    read = await backtest.run(ToolCallRequest("c1", "policies_coverage", ada), "bt:1")
    assert read.record.error is None and read.record.tool_result["coverageLimit"] == 20_000
    assert len(runtime.calls) == before + 1  # the server was asked
    opened = await backtest.run(ToolCallRequest("c2", "policies_open_investigation", {
        "claim_id": "CLM-00001", "reason": "a pattern"}), "bt:2")
    assert opened.record.error is not None and NOT_IN_RECORD in opened.record.error
    assert len(runtime.calls) == before + 1  # refused: nothing was sent
    assert answers.asked_live == [
        'mcp-policies {"arguments":{"claimant_name":"Ada Lovelace","policy_number":'
        '"POL-100001"},"tool":"coverage"}']
    assert len(answers.unanswered) == 1 and "open_investigation" in answers.unanswered[0]


async def test_arguments_are_checked_against_the_servers_schema_before_sending(
    served: tuple[ToolBox, InProcessWorkerRuntime],
) -> None:
    box, runtime = served
    before = len(runtime.calls)
    outcome = await box.run(ToolCallRequest("c1", "policies_coverage", {
        "policy_number": 5, "claimant_name": "Ada"}), "case:1")
    assert outcome.record.error == ("invalid arguments for 'policies_coverage': "
                                    "policy_number: 5 is not of type 'string'")
    assert len(runtime.calls) == before  # nothing was sent
    failed = await box.run(ToolCallRequest("c2", "policies_coverage", {
        "policy_number": "POL-999999", "claimant_name": "Ada"}), "case:2")
    assert failed.record.error is not None and "no policy POL-999999" in failed.record.error
    assert failed.observation.is_error  # isError: an observation like any failed tool


def test_the_examples_own_tests_pass_as_its_team_runs_them(example: Path) -> None:
    """``pytest`` in the example project, with only what pip installed on the path: its
    agent tested in process with ``casetrail.testing.run_case`` and its real server."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=EXAMPLE, env={**os.environ, "PYTHONPATH": str(example)},
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "5 passed" in done.stdout, done.stdout


def test_an_operator_checks_the_configured_servers_with_the_cli(
    settings: Settings, example: Path,
) -> None:
    """``casetrail mcp-tools``: what each server serves, as the model will see it; exit 2
    naming a server that cannot be reached."""
    servers = [McpServer(**stdio_policies()),
               McpServer(name="gone", transport="http", url=f"http://127.0.0.1:{free_port()}/mcp",
                         timeout_seconds=2)]
    done = subprocess.run(
        [sys.executable, "-m", "casetrail.cli", "mcp-tools"],
        env=settings.model_copy(update={"mcp_servers": servers}).environment(
            PYTHONPATH=str(example)),
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "policies  coverage  as policies_coverage  retried" in done.stdout
    assert "policies  open_investigation  as policies_open_investigation  at most once" \
        in done.stdout
    assert "server gone: the MCP server gone is unavailable: ConnectError" in done.stderr
