"""Operating casetrail: every component's /metrics and one case's trace, as real
processes export them (to a real OTLP/HTTP receiver), during a real loan case."""

from __future__ import annotations

import secrets
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from playwright.async_api import Browser

from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from tests.support.helpers import ended, wait_until
from tests.support.metrics import scrape, total
from tests.support.otlp import ReceivedSpan, Receiver, otlp_receiver
from tests.support.stack import (
    api_ready,
    free_port,
    kill_leftovers,
    namespace_of_its_own,
    spawn,
    stop_cleanly,
)

COMPONENTS = ("api", "worker", "consumer", "capability")






@pytest.fixture(scope="module")
async def receiver() -> AsyncIterator[Receiver]:
    async with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
async def observed(settings: Settings, database: str, receiver: Receiver
                   ) -> AsyncIterator[dict[str, Any]]:
    """The four components as processes in a namespace of their own (so that no other
    test's case moves their counters), each with its metrics on a port of the test's
    choosing, exporting every span (message content opted in) to ``receiver``."""
    async with namespace_of_its_own(settings, "telemetry") as (own, pool, key):
        port = free_port()
        ports = {c: free_port() for c in COMPONENTS}
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_TRACES_SAMPLER": "parentbased_always_on",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}

        def start(component: str, *args: str) -> subprocess.Popen[bytes]:
            return spawn(own, *args, **otel, **{
                f"CASETRAIL_{component.upper()}_METRICS_PORT": str(ports[component])})

        children = {
            "api": start("api", "api", "--port", str(port)),
            "worker": start("worker", "worker"),
            "consumer": start("consumer", "consumer"),
            "capability": start("capability", "capability-worker"),
        }
        base_url = f"http://127.0.0.1:{port}"

        async def ready() -> bool:
            if not await api_ready(base_url):
                return False
            try:
                for component in COMPONENTS:
                    await scrape(ports[component])
            except httpx.TransportError:
                return False
            return True

        try:
            await wait_until(ready, timeout=30, interval=0.2)
            yield {"base_url": base_url, "ports": ports, "pool": pool,
                   "headers": {"Authorization": f"Bearer {key}"}}
            await stop_cleanly(children)
        finally:
            kill_leftovers(children)


@pytest.fixture(scope="module")
async def loan_case(observed: dict[str, Any]) -> dict[str, Any]:
    """One loan case through the processes, started inside a trace of the test's own
    (its ``traceparent`` on POST /cases); its id, trace id and scrapes before/after."""
    before = {c: await scrape(p) for c, p in observed["ports"].items()}
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    async with httpx.AsyncClient(base_url=observed["base_url"],
                                 headers=observed["headers"]) as client:
        reply = await client.post("/cases", json={
            "agent": "loan-officer", "input": SAMPLE_APPLICATIONS[0]},
            headers={"traceparent": f"00-{trace_id}-{parent}-01"})
        assert reply.status_code == 202, reply.text
        case_id = uuid.UUID(reply.json()["caseId"])
        case = await ended(client, case_id, timeout=30)
    assert case["status"] == "completed"
    events = await wait_until(lambda: _stored(observed["pool"], case_id), timeout=10)
    after = {c: await scrape(p) for c, p in observed["ports"].items()}
    return {"case_id": case_id, "trace_id": trace_id, "parent": parent, "before": before,
            "after": after, "events": events}


async def _stored(pool: asyncpg.Pool, case_id: uuid.UUID) -> list[asyncpg.Record] | None:
    rows = await pool.fetch("SELECT event_type, payload FROM event_log WHERE case_id = $1 "
                            "ORDER BY attempt, seq", case_id)
    return rows if rows and rows[-1]["event_type"] == "CASE_COMPLETED" else None


def moved(case: dict[str, Any], component: str, name: str, **labels: str) -> float:
    return (total(case["after"][component], name, **labels)
            - total(case["before"][component], name, **labels))


async def test_each_component_serves_its_metrics_and_they_move_with_a_case(
    loan_case: dict[str, Any], observed: dict[str, Any],
) -> None:
    events = loan_case["events"]
    cycles = sum(1 for e in events if e["event_type"] == "REACT_CYCLE")
    tool_calls = [c for e in events if e["event_type"] == "REACT_CYCLE"
                  for c in e["payload"]["toolCalls"]]
    worker_calls = [c for c in tool_calls if c["toolSource"] == "worker"]
    assert cycles >= 2 and worker_calls

    assert moved(loan_case, "api", "casetrail_http_requests_total", method="POST",
                 route="/cases", status="202") == 1
    assert moved(loan_case, "api", "casetrail_cases_accepted_total", agent="loan-officer") == 1
    assert moved(loan_case, "api", "casetrail_publish_confirm_seconds_count") >= 1

    assert moved(loan_case, "worker", "casetrail_cases_started_total", agent="loan-officer",
                 attempt="first") == 1
    assert moved(loan_case, "worker", "casetrail_cases_ended_total", agent="loan-officer",
                 outcome="completed") == 1
    assert moved(loan_case, "worker", "casetrail_cycles_total", agent="loan-officer") == cycles
    assert moved(loan_case, "worker", "casetrail_model_request_duration_seconds_count",
                 provider="scripted", outcome="ok") == cycles
    tokens = sum(e["payload"]["tokenUsage"]["inputTokens"] for e in events
                 if e["event_type"] == "REACT_CYCLE")
    assert moved(loan_case, "worker", "casetrail_model_tokens_total", agent="loan-officer",
                 type="input") == tokens > 0
    assert moved(loan_case, "worker", "casetrail_tool_call_duration_seconds_count",
                 source="worker", outcome="ok") == len(worker_calls)
    assert moved(loan_case, "worker", "casetrail_tool_call_duration_seconds_count") \
        == len(tool_calls)
    assert moved(loan_case, "worker", "casetrail_publish_confirm_seconds_count") \
        >= len(events) + len(worker_calls)
    worker = loan_case["after"]["worker"]
    assert total(worker, "casetrail_live_cases") in (0.0, 1.0)  # it may still be ending

    async def idle() -> bool:  # once the case has ended in the worker too
        return total(await scrape(observed["ports"]["worker"]), "casetrail_live_cases") == 0
    await wait_until(idle, timeout=10, interval=0.1)
    assert any(n == "casetrail_queue_messages" and labels == {"queue": "case-start"}
               for n, labels, _ in worker)

    assert moved(loan_case, "consumer", "casetrail_events_stored_total") >= len(events)
    assert moved(loan_case, "consumer", "casetrail_consumer_batch_size_count") >= 1
    assert moved(loan_case, "consumer", "casetrail_consumer_commit_seconds_count") >= 1
    consumer = loan_case["after"]["consumer"]
    assert {labels["queue"] for n, labels, _ in consumer if n == "casetrail_queue_messages"} \
        == {"event-log", "dead-letters"}

    assert moved(loan_case, "capability", "casetrail_tool_requests_served_total",
                 outcome="ok") == len(worker_calls)


def _by_name(spans: list[ReceivedSpan], prefix: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_one_case_is_one_trace_with_the_genai_spans(
    loan_case: dict[str, Any], receiver: Receiver,
) -> None:
    trace_id = loan_case["trace_id"]
    events = loan_case["events"]
    cycles = [e["payload"] for e in events if e["event_type"] == "REACT_CYCLE"]
    calls = [c for cycle in cycles for c in cycle["toolCalls"]]

    async def complete() -> list[ReceivedSpan] | None:
        spans = receiver.of_trace(trace_id)
        return spans if len(_by_name(spans, "store ")) >= 1 and len(
            _by_name(spans, "process ")) >= sum(c["toolSource"] == "worker" for c in calls) \
            else None

    spans = await wait_until(complete, timeout=15, interval=0.1)
    by_id = {s.span_id: s for s in spans}

    [post] = _by_name(spans, "POST /cases")
    assert (post.service, post.kind, post.parent_id) == ("casetrail-api", "SERVER",
                                                         loan_case["parent"])
    assert post.attributes["http.response.status_code"] == 202

    [agent] = _by_name(spans, "invoke_agent ")
    assert agent.name == "invoke_agent loan-officer" and agent.service == "casetrail-worker"
    assert agent.parent_id == post.span_id
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.agent.name"] == "loan-officer"
    assert agent.attributes["gen_ai.conversation.id"] == str(loan_case["case_id"])
    started = events[0]["payload"]
    assert started["trace"] == {"traceId": trace_id, "spanId": agent.span_id}

    chats = sorted(_by_name(spans, "chat "), key=lambda s: s.start_ns)
    assert len(chats) == len(cycles)
    for chat, cycle in zip(chats, cycles, strict=True):
        assert chat.parent_id == agent.span_id and chat.kind == "CLIENT"
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "scripted"
        assert chat.name == f"chat {chat.attributes['gen_ai.request.model']}"
        assert chat.attributes["gen_ai.usage.input_tokens"] == cycle["tokenUsage"]["inputTokens"]
        assert chat.attributes["gen_ai.usage.output_tokens"] \
            == cycle["tokenUsage"]["outputTokens"]
        assert chat.attributes["gen_ai.response.finish_reasons"] == [cycle["finishReason"]]

    tools = _by_name(spans, "execute_tool ")
    assert sorted(t.attributes["gen_ai.tool.call.id"] for t in tools) \
        == sorted(c["toolCallId"] for c in calls)
    for tool in tools:
        call = next(c for c in calls if c["toolCallId"] == tool.attributes["gen_ai.tool.call.id"])
        assert tool.parent_id == agent.span_id
        assert tool.name == f"execute_tool {call['toolName']}"
        assert tool.attributes["gen_ai.tool.name"] == call["toolName"]
        assert tool.attributes["gen_ai.tool.type"] == (
            "extension" if call["toolSource"] == "worker" else "function")
        served = [s for s in _by_name(spans, "process ") if s.parent_id == tool.span_id]
        assert len(served) == (call["toolSource"] == "worker")
        assert all(s.service == "casetrail-capability" and s.kind == "CONSUMER"
                   for s in served)

    stores = _by_name(spans, "store ")
    assert all(s.service == "casetrail-consumer" and s.parent_id in by_id for s in stores)
    assert sum(s.attributes["casetrail.events"] for s in stores) >= len(events)

    # Message content was opted in: there, with the sensitive name as its placeholder.
    name = SAMPLE_APPLICATIONS[0]["applicantName"]
    content = [str(v) for s in spans for k, v in s.attributes.items()
               if k in ("gen_ai.input.messages", "gen_ai.output.messages",
                        "gen_ai.tool.call.arguments", "gen_ai.tool.call.result")]
    assert any("[pii:applicantName]" in text for text in content)
    assert not any(name in str(v) for s in spans for v in s.attributes.values())


@pytest.mark.parametrize("opted_in", [False, True])
def test_message_content_only_when_opted_in_and_then_redacted(
    opted_in: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GenAI spans of an attempt, made by an SDK tracer of the test's own: content
    attributes appear only with the opt-in, and the case's redaction applies to them."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from casetrail.contract.events import TokenUsage
    from casetrail.engine.chat import AssistantTurn, SystemMessage, UserMessage
    from casetrail.telemetry import genai, tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    monkeypatch.setattr(tracing, "CAPTURE_CONTENT", opted_in)

    attempt = genai.AttemptTrace.begin(
        agent="loan-officer", agent_version="1", case_id="c-1", attempt=1,
        provider="openai", model="gpt-test",
        redact=lambda text: text.replace("Maria Okafor", "[pii:applicantName]"))
    chat = attempt.chat("gpt-test", [SystemMessage("Decide."),
                                     UserMessage("Applicant: Maria Okafor")])
    attempt.answered(chat, AssistantTurn(text="Maria Okafor qualifies", model="gpt-test-1",
                                         usage=TokenUsage(input_tokens=7, output_tokens=3)))
    tool = genai.tool_span("credit-score", "call-1", "extension", {"name": "Maria Okafor"})
    genai.tool_done(tool, None, {"score": 720})
    attempt.end("completed", None, 7, 3)

    spans = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}
    assert set(spans) == {"invoke_agent loan-officer", "chat gpt-test",
                          "execute_tool credit-score"}
    assert spans["chat gpt-test"]["gen_ai.usage.input_tokens"] == 7
    assert spans["chat gpt-test"]["gen_ai.response.model"] == "gpt-test-1"
    content_keys = {"gen_ai.input.messages", "gen_ai.output.messages",
                    "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"}
    present = {k for attributes in spans.values() for k in attributes} & content_keys
    assert present == (content_keys if opted_in else set())
    text = " ".join(str(v) for attributes in spans.values() for v in attributes.values())
    assert "Maria Okafor" not in text
    assert ("[pii:applicantName]" in text) is opted_in


async def test_the_trace_drawn_as_a_waterfall(loan_case: dict[str, Any],
                                             receiver: Receiver, browser: Browser) -> None:
    """docs/trace-waterfall.png: the spans of the loan case above, as a person sees them."""
    from tests.support.browser import DOCS
    from tests.support.waterfall import render

    spans = [s for s in receiver.of_trace(loan_case["trace_id"])
             if s.parent_id != loan_case["parent"] or s.name == "POST /cases"]
    page_html = render(spans, f"One loan case, one trace ({loan_case['trace_id']}): "
                              f"{len(spans)} spans from 4 services")
    page = await browser.new_page(viewport={"width": 1200, "height": 400})
    await page.set_content(page_html)
    rows = await page.locator(".row").count()
    assert rows == len(spans)
    await page.screenshot(path=str(DOCS / "trace-waterfall.png"), full_page=True)
    await page.close()
