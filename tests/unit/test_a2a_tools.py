"""Remote A2A agents as tools, the parts that need no network: the operator's setting,
the card pin, which fields may carry a sensitive value, the declaration, the record's
wire name, and a configuration that names an agent nobody configured."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel, ValidationError

from casetrail import A2aTool, Agent, DeclarationError, ModelRef
from casetrail.a2a.remote import RemoteAgent, card_digest, card_interfaces, pinned
from casetrail.cases.configured import agent_problems
from casetrail.config import A2aAgent, Settings
from casetrail.contract.events import A2aCallRef, ToolCallRecord
from casetrail.engine.tools import ToolFailed

CARD = {"name": "kyc-check", "version": "1.0.0", "skills": [{"id": "sanctions"}]}


def test_a_card_url_is_https_or_loopback() -> None:
    assert A2aAgent(name="kyc", card_url="https://kyc.example/.well-known/agent-card.json")
    assert A2aAgent(name="kyc", card_url="http://127.0.0.1:9/.well-known/agent-card.json")
    with pytest.raises(ValidationError, match="https://"):
        A2aAgent(name="kyc", card_url="http://kyc.example/.well-known/agent-card.json")


def test_only_the_pinned_card_is_accepted() -> None:
    agent = A2aAgent(name="kyc", card_url="https://kyc.example/card")
    digest = card_digest(CARD)
    assert digest == card_digest(dict(reversed(list(CARD.items()))))  # canonical JSON
    with pytest.raises(ToolFailed, match=f"no card is pinned; it serves {digest}"):
        pinned(agent, CARD)
    assert pinned(agent.model_copy(update={"card_digest": digest}), CARD) == digest
    changed = {**CARD, "version": "1.0.1"}
    with pytest.raises(ToolFailed, match=f"its card changed \\(pinned {digest}") as refused:
        pinned(agent.model_copy(update={"card_digest": digest}), changed)
    assert refused.value.retryable is False


def test_a_sensitive_value_goes_only_in_the_fields_the_operator_lists() -> None:
    remote = RemoteAgent(A2aAgent(name="kyc", card_url="https://kyc.example/card",
                                  sensitive_fields=["passport"]))
    values = {"[pii:passport]": "X1", "[pii:name]": "Ann"}
    assert remote.sensitive_refusal({"arguments": {"passport": "[pii:passport]"}}, values) \
        is None
    refusal = remote.sensitive_refusal(
        {"arguments": {"passport": "[pii:passport]", "note": "for [pii:name]"}}, values)
    assert refusal is not None and "in note (its sensitiveFields: passport)" in refusal
    assert remote.sensitive_refusal({"arguments": {"note": "x"}}, {}) is None


def test_the_declaration_and_the_record() -> None:
    tool = A2aTool("kyc", "sanctions")
    assert tool.name == "kyc_sanctions" and tool.capability == "a2a-kyc"
    assert tool.a2a is not None and tool.a2a.text  # no input model: the model writes text
    assert tool.parameters["required"] == ["text"]
    with pytest.raises(DeclarationError):
        A2aTool("KYC!")
    record = ToolCallRecord(tool_name="kyc_sanctions", tool_args={}, tool_result=[],
                            tool_source="worker", duration=timedelta(0),
                            a2a=A2aCallRef(agent="kyc", task_id="t-1"))
    dumped = record.model_dump(mode="json", by_alias=True)
    assert dumped["a2a"] == {"agent": "kyc", "taskId": "t-1"}


def test_an_agent_naming_an_unconfigured_a2a_agent_cannot_run() -> None:
    class Ask(BaseModel):
        question: str

    agent = Agent(name="asker", version="1.0.0", description="d", instructions="i",
                  input=Ask, answer=Ask, tools=[A2aTool("kyc", "sanctions")],
                  model=ModelRef(provider="openai", name="gpt-4o-mini")).profile()
    problems = agent_problems(agent, Settings(), served=())
    assert any("names the A2A agent 'kyc', which CASETRAIL_A2A_AGENTS does not configure"
               in p for p in problems), problems
    configured = Settings(a2a_agents=[A2aAgent(name="kyc",
                                               card_url="https://kyc.example/card")])
    assert not any("A2A" in p for p in agent_problems(agent, configured, served=()))
    assert problems != agent_problems(agent, configured, served=())


def test_every_interface_a_card_names_is_held_to_the_card_urls_rule() -> None:
    """The agent's credentials go to the interfaces its card names: an http one off this
    host is refused before anything is sent, as ``cardUrl`` would be."""
    agent = A2aAgent(name="kyc", card_url="https://kyc.example/card")
    card_interfaces(agent, {**CARD, "supportedInterfaces": [
        {"url": "https://kyc.example/a2a", "protocolBinding": "JSONRPC"},
        {"url": "http://127.0.0.1:9/a2a", "protocolBinding": "HTTP+JSON"}]})
    for where in ({"url": "http://kyc.example/a2a"},
                  {"supportedInterfaces": [{"url": "http://10.0.0.7/a2a"}]},
                  {"additionalInterfaces": [{"url": "ftp://kyc.example/a2a"}]}):
        with pytest.raises(ToolFailed, match="refused before its credentials") as refused:
            card_interfaces(agent, {**CARD, **where})
        assert refused.value.retryable is False


async def test_a_card_that_redirects_elsewhere_is_not_followed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A card URL answering with a redirect to another host: refused, and that host is
    never asked (nor sent the agent's credentials)."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from casetrail.a2a import A2aRequest

    asked: list[str] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    elsewhere = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirecting(Elsewhere):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{elsewhere.server_port}/card")
            self.end_headers()

    origin = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    for server in (elsewhere, origin):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("KYC_TOKEN", "secret")
    agent = A2aAgent(name="kyc", card_url=f"http://127.0.0.1:{origin.server_port}/card",
                     headers_env={"Authorization": "KYC_TOKEN"})
    try:
        with pytest.raises(ToolFailed, match="answered 302"):
            await RemoteAgent(agent).answer(A2aRequest(arguments={"q": 1}, message_id="m1"))
        await asyncio.sleep(0.05)
        assert asked == []
    finally:
        for server in (elsewhere, origin):
            server.shutdown()
