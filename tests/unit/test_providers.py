"""Real providers over real HTTP (casetrail's shared aiohttp clients), against a local
server that speaks each provider's wire format."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from casetrail.agents import AGENTS
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import ModelEndpoint, Settings
from casetrail.contract.events import ModelRef
from casetrail.engine.case import fit_to_budget
from casetrail.engine.chat import (
    ChatMessage,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from casetrail.engine.loop import ReactEngine
from casetrail.errors import ModelRejected, ModelUnavailable
from casetrail.providers import ModelFactory
from casetrail.providers.anthropic_messages import AnthropicChatModel
from casetrail.providers.clients import ModelClients
from casetrail.providers.openai_compat import OpenAIChatModel
from tests import conftest
from tests.support.fake_llm import FakeLLM, Reply, anthropic_turn, error, fake_llm, openai_turn
from tests.support.helpers import ListSink, spec_for, toolbox

ENDPOINT_SECRET = "sk-endpoint-only-3f9a1c"
SECRET = "sk-test-secret-0000"
TOOLS = [ToolSpec("debt-to-income", "ratio", {"type": "object", "properties": {}})]
PROMPT: list[ChatMessage] = [SystemMessage("be careful"), UserMessage("hello")]


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    async with fake_llm() as server:
        yield server


@pytest.fixture(scope="module")
async def openai_server() -> AsyncIterator[FakeLLM]:
    """One fake OpenAI-compatible server for the module's tests of shared clients."""
    async with fake_llm() as server:
        yield server


@pytest.fixture
async def clients() -> AsyncIterator[ModelClients]:
    made = ModelClients()
    yield made
    await made.aclose()


def openai_model(fake: FakeLLM, clients: ModelClients) -> OpenAIChatModel:
    return OpenAIChatModel("gpt-test", clients.client("openai", f"{fake.base_url}/v1", SECRET))


def anthropic_model(fake: FakeLLM, clients: ModelClients) -> AnthropicChatModel:
    return AnthropicChatModel("claude-test", clients.client("anthropic", fake.base_url, SECRET))


async def test_openai_tool_calls_usage_and_wire_format(
    fake: FakeLLM, clients: ModelClients,
) -> None:
    fake.script = [openai_turn("Checking two things.", calls=[
        ("call_a", "debt-to-income", '{"monthlyDebt": 1, "monthlyIncome": 4}'),
        ("call_b", "lending-policy", '{"creditScore": 700}'),
    ], prompt=120, completion=30)]
    turn = await openai_model(fake, clients).request(PROMPT, TOOLS)
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_a", "debt-to-income", {"monthlyDebt": 1, "monthlyIncome": 4}),
        ("call_b", "lending-policy", {"creditScore": 700}),
    ]
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (120, 30)
    assert turn.finish_reason == "tool_calls" and turn.model == "gpt-test"
    sent = fake.requests[0]
    assert sent["model"] == "gpt-test"
    assert sent["messages"] == [{"role": "system", "content": "be careful"},
                                {"role": "user", "content": "hello"}]
    assert sent["tools"][0] == {"type": "function", "function": {
        "name": "debt-to-income", "description": "ratio",
        "parameters": {"type": "object", "properties": {}}}}
    assert fake.headers[0]["authorization"] == f"Bearer {SECRET}"


async def test_openai_malformed_arguments_become_a_tool_error_the_model_sees(
    fake: FakeLLM, clients: ModelClients,
) -> None:
    fake.script = [
        openai_turn(None, calls=[("call_x", "debt-to-income", '{"monthlyDebt": 1,')]),
        openai_turn('{"decision": "refer"}'),
    ]
    sink = ListSink()
    await ReactEngine(sink).run(spec_for(SAMPLE_APPLICATIONS[0], typed=False),
                                openai_model(fake, clients),
                                toolbox())
    assert sink.types == ["CASE_STARTED", "REACT_CYCLE", "REACT_CYCLE", "CASE_COMPLETED"]
    record = sink.events[1].payload.tool_calls[0]  # type: ignore[union-attr]
    assert record.error is not None and "not a JSON object" in record.error
    assert record.raw_args == '{"monthlyDebt": 1,'
    tool_message = fake.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_x"
    assert tool_message["content"].startswith("ERROR: ")
    assert fake.requests[1]["messages"][-2]["tool_calls"][0]["function"]["arguments"] == \
        '{"monthlyDebt": 1,'


async def test_429_then_success_is_retried_and_recorded(
    fake: FakeLLM, clients: ModelClients,
) -> None:
    fake.script = [error(429, "slow down", {"retry-after": "0"}),
                   error(503, "overloaded"), openai_turn('{"decision": "approve"}')]
    sink = ListSink()
    await ReactEngine(sink).run(spec_for(SAMPLE_APPLICATIONS[0], typed=False),
                                openai_model(fake, clients),
                                toolbox())
    assert sink.types == ["CASE_STARTED", "REACT_CYCLE", "CASE_COMPLETED"]
    retries = sink.events[1].payload.model_retries  # type: ignore[union-attr]
    assert [r.reason for r in retries] == ["openai answered 429: slow down",
                                           "openai answered 503: overloaded"]
    assert retries[0].waited.total_seconds() == 0


async def test_5xx_until_the_deadline_times_out_with_the_retries_on_record(
    fake: FakeLLM, clients: ModelClients,
) -> None:
    fake.script, fake.repeat_last = [error(500, "boom")], True
    sink = ListSink()
    await ReactEngine(sink).run(spec_for(SAMPLE_APPLICATIONS[0], deadline=2.5),
                                openai_model(fake, clients), toolbox())
    assert sink.types == ["CASE_STARTED", "CASE_TIMED_OUT"]
    retries = sink.events[-1].payload.model_retries  # type: ignore[union-attr]
    assert len(retries) >= 2 and all("500" in r.reason for r in retries)
    assert len(fake.requests) == len(retries) + 1


async def test_401_fails_the_case_with_a_fixed_text_never_the_key(
    fake: FakeLLM, clients: ModelClients,
) -> None:
    # Providers echo part of the key they refused; none of it may reach the trail.
    fake.script = [error(401, f"Incorrect API key provided: {SECRET[:9]}***{SECRET[-4:]}")]
    sink = ListSink()
    await ReactEngine(sink).run(spec_for(SAMPLE_APPLICATIONS[0], typed=False),
                                anthropic_model(fake, clients),
                                toolbox())
    assert sink.types == ["CASE_STARTED", "CASE_FAILED"]
    payload = sink.events[-1].payload
    assert payload.reason_code == "model_error"  # type: ignore[union-attr]
    assert payload.message == (  # type: ignore[union-attr]
        "anthropic answered 401: authentication failed: the provider refused the "
        "configured API key")
    assert len(fake.requests) == 1  # permanent: never retried
    assert all(SECRET[:9] not in e.to_json().decode() and SECRET[-4:] not in
               e.to_json().decode() for e in sink.events)


def test_credentials_in_other_provider_messages_are_scrubbed() -> None:
    from casetrail.errors import scrub
    from casetrail.providers._errors import status_error

    error = status_error("openai", 400, None, {"error": {"message": (
        "bad request for key sk-live-ABCDEF123456 and token=eyJhbGciOi.abc; " + "x" * 900)}},
        "fallback")
    text = str(error)
    assert "sk-live" not in text and "eyJhbGciOi" not in text and "[redacted]" in text
    assert len(text) < 600
    assert scrub("model gpt-4o-mini does not exist") == "model gpt-4o-mini does not exist"


async def test_anthropic_thinking_and_tool_use_round_trip(
    fake: FakeLLM, clients: ModelClients,
) -> None:
    thinking = {"type": "thinking", "thinking": "The ratio decides it.", "signature": "sig=="}
    fake.script = [
        anthropic_turn([thinking, {"type": "text", "text": "Computing the ratio."},
                        {"type": "tool_use", "id": "toolu_1", "name": "debt-to-income",
                         "input": {"monthlyDebt": 1000, "monthlyIncome": 4000}},
                        {"type": "tool_use", "id": "toolu_2", "name": "debt-to-income",
                         "input": {"monthlyDebt": 1, "monthlyIncome": 0}}],
                       stop="tool_use", prompt=300, completion=40),
        anthropic_turn([{"type": "text", "text": '{"decision": "approve"}'}]),
    ]
    sink = ListSink()
    await ReactEngine(sink).run(spec_for(SAMPLE_APPLICATIONS[0], typed=False),
                                anthropic_model(fake, clients),
                                toolbox())
    assert sink.types == ["CASE_STARTED", "REACT_CYCLE", "REACT_CYCLE", "CASE_COMPLETED"]
    cycle = sink.events[1].payload
    assert cycle.reasoning_text.startswith("The ratio decides it.")  # type: ignore[union-attr]
    assert "Computing the ratio." in cycle.reasoning_text  # type: ignore[union-attr]
    assert cycle.token_usage.input_tokens == 300  # type: ignore[union-attr]
    assert cycle.finish_reason == "tool_use" and cycle.model == "claude-test"  # type: ignore[union-attr]
    records = cycle.tool_calls  # type: ignore[union-attr]
    assert records[0].tool_result == {"dti": 0.25}
    assert records[1].error is not None  # monthlyIncome must be > 0
    second = fake.requests[1]
    assert second["system"].startswith("You are a loan officer")
    assistant, results = second["messages"][-2], second["messages"][-1]
    assert assistant["content"][0] == thinking  # sent back verbatim, signature included
    assert [b["tool_use_id"] for b in results["content"]] == ["toolu_1", "toolu_2"]
    assert [b["is_error"] for b in results["content"]] == [False, True]
    sent = fake.headers[0]  # Anthropic's own authentication, not a bearer token
    assert sent["x-api-key"] == SECRET and sent["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent


async def test_transport_failures_are_transient(fake: FakeLLM, clients: ModelClients) -> None:
    dead = OpenAIChatModel("gpt-test", clients.client("openai", "http://127.0.0.1:9/v1", SECRET))
    with pytest.raises(ModelUnavailable, match="unreachable"):
        await dead.request(PROMPT, TOOLS)
    fake.script = [error(404, "no such model")]
    with pytest.raises(ModelRejected, match="404"):
        await openai_model(fake, clients).request(PROMPT, TOOLS)


async def test_redirects_are_not_followed_and_odd_answers_are_errors(
    fake: FakeLLM, clients: ModelClients,
) -> None:
    """A key never follows a redirect: a 3xx ends the request, and the place it points
    to is never asked. An answer that is not a JSON object is a provider failure."""
    target = f"{fake.base_url}/v1/chat/completions"
    fake.script = [error(307, "moved", {"location": target})]
    with pytest.raises(ModelRejected, match="openai answered 307"):
        await openai_model(fake, clients).request(PROMPT, TOOLS)
    assert len(fake.requests) == 1
    fake.script = [Reply(200, ["not", "an", "object"])]  # type: ignore[arg-type]
    with pytest.raises(ModelUnavailable, match="not a JSON object"):
        await openai_model(fake, clients).request(PROMPT, TOOLS)


async def test_the_guard_stops_requests_to_real_providers(clients: ModelClients) -> None:
    real = OpenAIChatModel("gpt-4o", clients.client("openai", None, "sk-none"))
    with pytest.raises(ModelUnavailable):
        await real.request(PROMPT, TOOLS)
    assert set(conftest.BLOCKED_HOSTS) == {"api.openai.com"}
    conftest.BLOCKED_HOSTS.clear()  # seen and expected here; anywhere else it fails the test


def test_context_budget_shortens_the_oldest_observations_deterministically() -> None:
    long = "x" * 4000
    messages: list[ChatMessage] = [SystemMessage("s"), UserMessage("u"),
                ToolResultMessage("c1", "t", long), ToolResultMessage("c2", "t", long),
                ToolResultMessage("c3", "t", "short")]
    fitted, trimmed = fit_to_budget(messages, budget=1200)
    assert trimmed == ["c1"]
    assert "observation shortened" in fitted[2].content  # type: ignore[union-attr]
    assert fitted[3] == messages[3] and fitted[4] == messages[4]
    assert fit_to_budget(messages, budget=1200) == (fitted, trimmed)
    assert fit_to_budget(messages, budget=None) == (messages, [])








@pytest.mark.parametrize(("url", "accepted"), [
    ("https://llm.example.com/v1", True), ("http://127.0.0.1:11434/v1", True),
    ("http://localhost:8080", True), ("http://[::1]:8080/v1", True),
    ("http://10.0.0.7:8080/v1", False), ("http://llm.internal/v1", False),
    ("ftp://127.0.0.1/v1", False), ("http://127.attacker.example/v1", False),
    ("http://127.0.0.1.nip.io/v1", False), ("http://127.8.9.10:8080/v1", True),
])
def test_an_endpoint_is_https_or_loopback(url: str, accepted: bool) -> None:
    """A key must not cross a network in clear: plain http only to this machine."""
    if accepted:
        assert ModelEndpoint(name="e", provider="openai", base_url=url).base_url == \
            url.rstrip("/")
    else:
        with pytest.raises(ValueError, match="loopback"):
            ModelEndpoint(name="e", provider="openai", base_url=url)


def test_endpoints_come_from_the_environment_as_json() -> None:
    configured = Settings(_env_file=None, model_endpoints=orjson.loads(
        b'[{"name": "local", "provider": "anthropic", "baseUrl": "http://127.0.0.1:9/",'
        b' "apiKeyEnv": "LOCAL_KEY"}]'))
    entry = configured.endpoint("local")
    assert entry is not None and entry.api_key_env == "LOCAL_KEY"
    assert configured.endpoint(provider="anthropic", base_url="http://127.0.0.1:9") == entry
    assert configured.endpoint(provider="openai", base_url="http://127.0.0.1:9") is None


async def test_cases_share_one_client_per_endpoint_and_shutdown_closes_it(
    settings: Settings, openai_server: FakeLLM, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two cases on one endpoint get the same client, whose pool serves both over one
    kept-alive connection; another key gets a client of its own; closing the factory
    (the worker's shutdown) closes them."""
    monkeypatch.setenv("CASETRAIL_TEST_SHARED_KEY", "sk-shared")
    monkeypatch.setenv("CASETRAIL_TEST_OTHER_KEY", "sk-other")
    base_url = f"{openai_server.base_url}/v1"
    configured = settings.model_copy(update={"model_endpoints": [
        ModelEndpoint(name="shared", provider="openai", base_url=base_url,
                      api_key_env="CASETRAIL_TEST_SHARED_KEY"),
        ModelEndpoint(name="other", provider="openai", base_url=base_url,
                      api_key_env="CASETRAIL_TEST_OTHER_KEY")]})
    factory = ModelFactory(configured)
    agent = AGENTS["loan-officer"]
    first, second = (factory(ModelRef(provider="openai", name="gpt-test", endpoint="shared"),
                             agent) for _ in range(2))
    assert first._client is second._client  # type: ignore[attr-defined]
    openai_server.script, openai_server.repeat_last = [openai_turn("done")], True
    openai_server.peers.clear()
    for model in (first, second, first, second):
        await model.request([UserMessage("hello")], [])
    assert len(set(openai_server.peers)) == 1  # one connection, kept alive, for both
    other = factory(ModelRef(provider="openai", name="gpt-test", endpoint="other"), agent)
    assert other._client is not first._client  # type: ignore[attr-defined]
    assert len(factory.clients) == 2
    shared = first._client  # type: ignore[attr-defined]
    session = shared._session
    assert session is not None and not session.closed
    await factory.aclose()
    assert shared.is_closed() and session.closed and len(factory.clients) == 0
    with pytest.raises(ModelUnavailable, match="closed"):  # a straggler after shutdown
        await first.request([UserMessage("hello")], [])
    openai_server.repeat_last = False


async def test_a_request_cut_short_does_not_poison_the_shared_pool(
    settings: Settings, openai_server: FakeLLM,
) -> None:
    """A case's deadline cancels its request mid-flight; the next request on the same
    shared client gets its own answer, never the late one of the cancelled request."""
    from dataclasses import replace

    configured = settings.model_copy(update={"model_endpoints": [
        ModelEndpoint(name="cut", provider="openai", base_url=f"{openai_server.base_url}/v1")]})
    factory = ModelFactory(configured)
    ref = ModelRef(provider="openai", name="gpt-test", endpoint="cut")
    model = factory(ref, AGENTS["loan-officer"])
    openai_server.script = [replace(openai_turn("the late answer"), delay=1.0),
                            openai_turn("the next answer"), openai_turn("the third answer")]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(model.request([UserMessage("first")], []), 0.2)
    again = factory(ref, AGENTS["loan-officer"])
    assert again._client is model._client  # type: ignore[attr-defined]
    turn = await again.request([UserMessage("second")], [])
    assert turn.text == "the next answer"
    await asyncio.sleep(1.0)  # the late answer is written to a connection nobody reads
    assert (await again.request([UserMessage("third")], [])).text == "the third answer"
    await factory.aclose()


def test_the_provider_registry_is_the_one_list_of_providers(settings: Settings) -> None:
    """A provider is a module and a line in service/contract/model_providers.py: the contract's
    ModelRef, the model endpoints, the OpenAPI document's choices and the factory all
    read that table."""
    from casetrail.api.openapi import _model_choice
    from casetrail.config import ModelEndpoint
    from casetrail.contract.events import ModelRef
    from casetrail.contract.model_providers import PROVIDERS, SCRIPTED
    from casetrail.providers import _chat_model

    assert ModelRef.model_json_schema()["properties"]["provider"]["enum"] == [
        SCRIPTED, *PROVIDERS]
    assert ModelEndpoint.model_json_schema()["properties"]["provider"]["enum"] == list(PROVIDERS)
    offered = [choice["properties"]["provider"]["const"]
               for choice in _model_choice(settings)["oneOf"]]
    assert sorted(offered) == sorted([SCRIPTED, *PROVIDERS])
    for spec in PROVIDERS.values():
        made = _chat_model(spec)
        assert callable(made) and hasattr(made, "request"), spec
        assert spec.request_headers("k")[spec.key_header] == f"{spec.key_prefix}k"
