"""Any A2A agent as a tool: a casetrail agent (tests/plugins/delegating.py) asks a remote
agent served by the official ``a2a-sdk`` server (tests/plugins/a2a_remote.py, started
here) through its capability worker, on the real bus. The call and its artifacts are
on a trail that verifies offline, with the remote task named; a task left waiting for
input, a card that changed since the operator pinned it, a sensitive value in a field
the operator did not list, and a remote agent that dies mid-task are each a recorded
tool failure, never a lost case."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from pypdf import PdfReader

from casetrail.a2a.remote import read_cards
from casetrail.agents import discover
from casetrail.audit.backtest import backtest_case
from casetrail.audit.replay import replay_case
from casetrail.audit.resume import RecordedEvent
from casetrail.config import A2aAgent, Settings
from casetrail.contract.events import ModelRef
from casetrail.engine.scripted import ScriptedModel
from tests.support.cli import check_bundle
from tests.support.helpers import ended, wait_until
from tests.support.stack import component_processes, free_port, namespace_of_its_own, port_open


class Remote:
    """The remote agent's server process, restartable (it dies in one test)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def card_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/.well-known/agent-card.json"

    async def start(self, *args: str) -> None:
        self.stop()
        self.process = self._spawn(args)
        await wait_until(lambda: port_open(self.port), timeout=20)

    def _spawn(self, args: tuple[str, ...]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "tests.plugins.a2a_remote",
                                 str(self.port), *args])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture(scope="module")
def remote() -> Iterator[Remote]:
    served = Remote()
    yield served
    served.stop()


@pytest.fixture(scope="module")
async def delegating(settings: Settings, database: str, remote: Remote
                     ) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    await remote.start()
    kyc = A2aAgent(name="kyc", card_url=remote.card_url, timeout_seconds=10, attempts=2)
    read = (await read_cards([kyc]))["kyc"]
    assert isinstance(read, dict) and read["accepted"] is False  # not pinned yet
    pinned = kyc.model_copy(update={"card_digest": read["served"]})
    async with namespace_of_its_own(settings, "a2atools", agents=[
            "tests.plugins.delegating:ONBOARDING"], a2a_agents=[pinned]) as (own, _, key), \
            component_processes(own, key) as (client, _):
        yield client, read["served"]


@pytest.fixture
async def running(remote: Remote) -> Remote:
    """The remote agent as pinned, running (an earlier test may have stopped it)."""
    if remote.process is None or remote.process.poll() is not None:
        await remote.start()
    return remote


async def onboard(client: httpx.AsyncClient, **given: Any) -> tuple[dict[str, Any],
                                                                    dict[str, Any]]:
    """The case's answer and its one tool call, as recorded."""
    started = await client.post("/cases", json={"agent": "onboarding", "input": given})
    assert started.status_code == 202, started.text
    view = await ended(client, started.json()["caseId"], timeout=60)
    assert view["status"] == "completed", view
    events = (await client.get(f"/cases/{view['caseId']}/events")).json()["events"]
    [called] = [c for e in events if e["eventType"] == "REACT_CYCLE"
                for c in e["payload"]["toolCalls"] if c["toolName"] == "kyc_sanctions"]
    return view, called


async def test_the_call_and_its_artifacts_are_on_a_trail_that_verifies_offline(
    delegating: tuple[httpx.AsyncClient, str], running: Remote, settings: Settings,
    tmp_path: Path,
) -> None:
    client, digest = delegating
    view, called = await onboard(client, customerId="S-1001")
    assert view["answer"] == {"customerId": "S-1001", "sanctionsHit": True,
                              "checkedBy": "remote-kyc", "problem": None}
    record = called["a2a"]
    assert record["agent"] == "kyc" and record["skill"] == "sanctions"
    assert record["cardDigest"] == digest and record["state"] == "TASK_STATE_COMPLETED"
    assert record["taskId"] and record["contextId"]
    [artifact] = called["toolResult"]
    assert artifact["name"] == "kyc" and artifact["parts"][0]["data"]["skill"] == "sanctions"
    assert called["toolSource"] == "worker"
    case_id = view["caseId"]
    assert (await client.get(f"/cases/{case_id}/verify")).json()["verified"] is True
    # The PDF names who answered, as it names an MCP call's server and tool.
    report = await client.get(f"/cases/{case_id}/report")
    text = " ".join(page.extract_text() for page in PdfReader(io.BytesIO(report.content)).pages)
    assert f"A2A agent kyc, skill sanctions, card {digest[:16]}" in " ".join(text.split())
    bundle = tmp_path / "bundle.json"
    bundle.write_bytes((await client.get(f"/cases/{case_id}/bundle")).content)
    keys = (await client.get("/signing-keys")).json()["keys"]
    checked = await asyncio.to_thread(check_bundle, settings, bundle,
                                      *(k["publicKey"] for k in keys))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "kyc" in orjson.dumps(orjson.loads(bundle.read_bytes())).decode()


async def test_replay_and_a_backtest_answer_the_remote_agent_as_it_answered(
    delegating: tuple[httpx.AsyncClient, str], running: Remote,
) -> None:
    """The record answers an A2A call with what the live call returned (the task with
    its artifacts), through the rule every tool kind is answered by: an unchanged
    agent replays the case "same", and as a backtest's challenger decides it the same
    with nothing unanswered."""
    client, _ = delegating
    view, _ = await onboard(client, customerId="S-1001")
    case_id = uuid.UUID(view["caseId"])
    events = (await client.get(f"/cases/{case_id}/events")).json()["events"]
    trail = [RecordedEvent(e["attempt"], e["seq"], e["eventType"], e["payload"],
                           datetime.fromisoformat(e["occurredAt"])) for e in events]
    agents = discover(["tests.plugins.delegating:ONBOARDING"]).agents
    replay = await replay_case(case_id, trail, agents)
    assert replay.outcome == "same", replay.as_json()
    onboarding = agents["onboarding"]
    model = ModelRef(provider="scripted", name="onboarding")
    assert onboarding.script is not None
    outcome = await backtest_case(case_id, trail, onboarding,
                                  ScriptedModel(onboarding.script, name=model.name), model)
    assert outcome.problem is None and outcome.unanswered == (), outcome
    assert outcome.answers[1] == view["answer"] == outcome.answers[0], outcome


async def test_a_task_left_waiting_for_input_is_a_tool_error_naming_it(
    delegating: tuple[httpx.AsyncClient, str], running: Remote,
) -> None:
    client, _ = delegating
    view, called = await onboard(client, customerId="ASK-1")
    assert "TASK_STATE_INPUT_REQUIRED" in called["error"], called
    assert "which jurisdiction?" in called["error"]
    assert called["a2a"] == {"agent": "kyc", "skill": "sanctions"}  # no answer to record
    assert "TASK_STATE_INPUT_REQUIRED" in view["answer"]["problem"]


async def test_a_sensitive_value_goes_only_in_a_field_the_operator_lists(
    delegating: tuple[httpx.AsyncClient, str], running: Remote,
) -> None:
    client, _ = delegating
    view, called = await onboard(client, customerId="C-2002", passport="X1234567")
    assert "may not be sent a sensitive value in passport" in called.get("error", ""), called
    assert "X1234567" not in orjson.dumps(view).decode()


async def test_a_card_that_changed_is_refused_until_the_operator_accepts_it(
    delegating: tuple[httpx.AsyncClient, str], running: Remote,
) -> None:
    client, digest = delegating
    await running.start("--name", "kyc-check-v2")  # the same agent, another card
    try:
        _, called = await onboard(client, customerId="C-3003")
    finally:
        await running.start()
    assert f"its card changed (pinned {digest}, served " in called["error"], called
    assert called["attempts"][-1]["attempt"] == 1  # refused, not retried


async def test_a_remote_agent_that_dies_mid_task_is_a_recorded_tool_failure(
    delegating: tuple[httpx.AsyncClient, str], running: Remote,
) -> None:
    client, _ = delegating
    view, called = await onboard(client, customerId="DIE-4004")
    assert running.process is not None and running.process.poll() is not None  # it died
    assert called["error"] and "kyc" in called["error"], called
    assert len(called["attempts"]) == 2  # retried once (the same messageId), then failed
    assert view["answer"]["sanctionsHit"] is None and view["answer"]["problem"]
    assert (await client.get(f"/cases/{view['caseId']}/verify")).json()["verified"] is True


@pytest.mark.parametrize("streams", [True, False], ids=["streaming", "polling"])
async def test_run_case_asks_the_remote_agent_from_this_process(streams: bool) -> None:
    """A team's own test of its agent: ``run_case`` calls the remote agent as a
    capability worker would, with the same pin; over the stream where its card says it
    streams, by polling its task otherwise."""
    from casetrail.testing import run_case
    from tests.plugins.delegating import ONBOARDING

    own = Remote()
    await own.start(*(() if streams else ("--no-streaming",)))
    try:
        read = (await read_cards([A2aAgent(name="kyc", card_url=own.card_url)]))["kyc"]
        assert isinstance(read, dict)
        run = await run_case(ONBOARDING, {"customerId": "SLOW-5005"}, a2a_agents=[
            {"name": "kyc", "cardUrl": own.card_url, "cardDigest": read["served"]}])
    finally:
        own.stop()
    [cycle, _] = run.cycles
    [called] = cycle["toolCalls"]
    assert called["a2a"]["state"] == "TASK_STATE_COMPLETED", called
    assert called["durationMs"] >= 2000  # followed to its end, two seconds of work
    assert run.events[-1].payload.model_dump(by_alias=True)["answer"]["checkedBy"] == \
        "remote-kyc"
