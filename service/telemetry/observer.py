"""casetrail's observer of the engine (service/engine/observing.py): each attempt and
tool call as Prometheus metrics and, when tracing is on, as GenAI spans."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.trace import Span

from casetrail.contract.events import TokenUsage
from casetrail.engine.chat import AssistantTurn, ChatMessage
from casetrail.telemetry import genai, metrics, tracing
from casetrail.telemetry.genai import AttemptTrace


class _ModelCall:
    def __init__(self, counters: metrics.AgentMetrics, trace: AttemptTrace | None,
                 span: Span | None) -> None:
        self.counters, self.trace, self.span = counters, trace, span

    def answered(self, turn: AssistantTurn, seconds: float) -> None:
        self.counters.model_ok.observe(seconds)
        if self.span is not None and self.trace is not None:
            self.trace.answered(self.span, turn)

    def failed(self, kind: str, reason: str, seconds: float, *, counted: str | None
               ) -> None:
        if counted == "retryable":
            self.counters.model_retryable.observe(seconds)
        elif counted == "refused":
            self.counters.model_error.observe(seconds)
        if self.span is not None:
            tracing.failed(self.span, kind, reason)
            self.span.end()


class _Attempt:
    def __init__(self, counters: metrics.AgentMetrics, trace: AttemptTrace | None,
                 first: bool) -> None:
        self.counters, self.trace, self.first = counters, trace, first
        self._untraced = _ModelCall(counters, None, None)
        """Every model call of an untraced attempt: it holds nothing of its own."""

    def started(self) -> None:
        (self.counters.started_first if self.first else self.counters.started_retry).inc()

    def trace_ids(self) -> tuple[str, str] | None:
        return None if self.trace is None else tracing.ids()

    def model_call(self, model: str, prompt: Sequence[ChatMessage]) -> _ModelCall:
        if self.trace is None:
            return self._untraced
        return _ModelCall(self.counters, self.trace, self.trace.chat(model, prompt))

    def retried(self) -> None:
        self.counters.retries.inc()

    def cycle(self, usage: TokenUsage) -> None:
        self.counters.cycles.inc()
        self.counters.input_tokens.inc(usage.input_tokens)
        self.counters.output_tokens.inc(usage.output_tokens)

    def ended(self, outcome: str, reason: str | None, usage: TokenUsage) -> None:
        self.counters.ended(outcome)
        if self.trace is not None:
            self.trace.end(outcome, reason, usage.input_tokens, usage.output_tokens)

    def finish(self) -> None:
        if self.trace is not None:
            self.trace.finish()


class _Tool:
    def __init__(self, label: str, source: str, span: Span | None) -> None:
        self.label, self.source, self.span = label, source, span

    def current(self) -> contextlib.AbstractContextManager[None]:
        return tracing.current(self.span)

    def done(self, error: str | None, result: Any, seconds: float) -> None:
        metrics.tool_call(self.label, self.source, error is None).observe(seconds)
        if self.span is not None:
            genai.tool_done(self.span, error, result)


class TelemetryObserver:
    """Metrics always; spans when ``OTEL_*`` turned tracing on."""

    def attempt(self, *, agent: str, agent_version: str, case_id: str, attempt: int,
                provider: str, model: str, redact: Callable[[str], str]) -> _Attempt:
        trace = None if not tracing.ENABLED else AttemptTrace.begin(
            agent=agent, agent_version=agent_version, case_id=case_id, attempt=attempt,
            provider=provider, model=model, redact=redact)
        return _Attempt(metrics.for_agent(agent, provider, model), trace, attempt == 1)

    def tool(self, label: str, call_id: str, source: str, arguments: Any) -> _Tool:
        span = None if not tracing.ENABLED else genai.tool_span(
            label, call_id, "extension" if source == "worker" else "function", arguments)
        return _Tool(label, source, span)


TELEMETRY = TelemetryObserver()
