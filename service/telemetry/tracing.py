"""OpenTelemetry traces, following the GenAI semantic conventions.

Configured only by the standard ``OTEL_*`` variables: on when an OTLP endpoint
is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``),
exported as ``http/protobuf``, sampled by ``OTEL_TRACES_SAMPLER`` (and its
argument), named by ``OTEL_SERVICE_NAME`` (default ``casetrail-<component>``);
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` keep it off. Off,
nothing here runs on the hot path: callers test :data:`ENABLED` first, and no
span, context or header is made.

One case is one trace: ``POST /cases`` puts a W3C ``traceparent`` on the start
command; the worker's ``invoke_agent <agent>`` span continues it, with a ``chat
<model>`` span per model request and an ``execute_tool <tool>`` span per tool
call; tool requests and events carry the context on, to the capability worker's
``process`` span and the consumer's ``store`` span.

Message content (prompts, answers, tool arguments and results) is recorded only
when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, and then with the
case's sensitive values replaced by their placeholders, as on the bus.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from casetrail.errors import PermanentError

log = logging.getLogger("casetrail.tracing")

ENABLED = False
"""Whether this process exports traces (set once, by :func:`configure`)."""
CAPTURE_CONTENT = False
"""Whether spans carry message content (the standard GenAI opt-in variable)."""

CONTENT_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
TRACEPARENT = "traceparent"
_TRUE = {"true", "1", "yes", "on"}

# GenAI semantic conventions (attribute names as the specification spells them).
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
AGENT_NAME = "gen_ai.agent.name"
AGENT_VERSION = "gen_ai.agent.version"
CONVERSATION = "gen_ai.conversation.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"

_tracer: trace.Tracer = trace.NoOpTracer()
_provider: Any = None


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def wanted() -> bool:
    """Whether the ``OTEL_*`` variables ask for traces."""
    if _env("OTEL_SDK_DISABLED").lower() in _TRUE:
        return False
    if _env("OTEL_TRACES_EXPORTER").lower() == "none":
        return False
    return bool(_env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or _env("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure(component: str) -> bool:
    """Start exporting this process's spans if the ``OTEL_*`` variables ask for it."""
    global ENABLED, CAPTURE_CONTENT, _tracer, _provider  # noqa: PLW0603 - set once, at start
    if ENABLED or not wanted():
        return ENABLED
    protocol = (_env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or _env("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol != "http/protobuf":
        raise PermanentError(f"casetrail exports traces as OTLP http/protobuf, not {protocol!r}:"
                             " unset OTEL_EXPORTER_OTLP_PROTOCOL or set it to http/protobuf")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"casetrail.component": component})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: f"casetrail-{component}"}))
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _provider, _tracer = provider, provider.get_tracer("casetrail")
    CAPTURE_CONTENT = _env(CONTENT_VARIABLE).lower() in _TRUE
    ENABLED = True
    log.info("exporting traces as %s (OTLP http/protobuf)", resource.attributes[SERVICE_NAME])
    return True


def shutdown() -> None:
    """Export what is left and stop (a component's last step)."""
    if _provider is not None:
        _provider.shutdown()


def tracer() -> trace.Tracer:
    return _tracer


def inject(headers: MutableMapping[str, Any]) -> None:
    """Put the current trace context (``traceparent``, ``tracestate``) in AMQP headers."""
    propagate.inject(headers)


def extract(headers: Mapping[str, Any] | None) -> otel_context.Context:
    """The trace context AMQP headers carry (an empty one when they carry none)."""
    if not headers or TRACEPARENT not in headers:
        return otel_context.Context()
    carrier = {k: v.decode() if isinstance(v, bytes) else v for k, v in headers.items()
               if k in (TRACEPARENT, "tracestate") and isinstance(v, str | bytes)}
    return propagate.extract(carrier)


def sampled(headers: Mapping[str, Any] | None) -> str | None:
    """The trace id of a sampled ``traceparent`` in ``headers`` (cheaply, no parsing of
    anything else); ``None`` when there is none or it was not sampled."""
    value = headers.get(TRACEPARENT) if headers else None
    if isinstance(value, bytes):
        value = value.decode()
    if not isinstance(value, str) or len(value) != 55 or not int(value[-2:], 16) & 1:
        return None
    return value[3:35]


@contextlib.contextmanager
def continued(headers: Mapping[str, Any] | None) -> Iterator[None]:
    """Run the block in the trace a message carries (nothing when tracing is off)."""
    if not ENABLED:
        yield
        return
    token = otel_context.attach(extract(headers))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def _current(span: Span) -> Iterator[None]:
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)


_NOTHING = contextlib.nullcontext()


def current(span: Span | None) -> contextlib.AbstractContextManager[None]:
    """Make ``span`` the current span for the block (nothing, cheaply, for ``None``)."""
    return _NOTHING if span is None else _current(span)


def ids(span: Span | None = None) -> tuple[str, str] | None:
    """``(trace id, span id)`` in hex of ``span`` (default: the current one) when it is
    recorded, else ``None``."""
    span = span or trace.get_current_span()
    found = span.get_span_context()
    if not span.is_recording() or not found.is_valid:
        return None
    return f"{found.trace_id:032x}", f"{found.span_id:016x}"


def failed(span: Span, error_type: str, message: str | None = None) -> None:
    """Mark ``span`` as failed with ``error.type`` (the conventions' error attribute)."""
    span.set_attribute(ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, message))


def start(name: str, kind: SpanKind = SpanKind.INTERNAL,
          attributes: Mapping[str, Any] | None = None, *,
          start_time: int | None = None) -> Span:
    return _tracer.start_span(name, kind=kind, attributes=attributes, start_time=start_time)


__all__ = [
    "CAPTURE_CONTENT",
    "ENABLED",
    "SpanKind",
    "configure",
    "continued",
    "current",
    "extract",
    "failed",
    "ids",
    "inject",
    "sampled",
    "shutdown",
    "start",
    "tracer",
]
