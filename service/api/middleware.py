"""ASGI middleware of the API."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from typing import Any

import orjson

from casetrail.telemetry import metrics, tracing

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """Answers 413 to a request body larger than ``limit`` bytes, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._too_large(send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        body = orjson.dumps({"type": "about:blank", "title": HTTPStatus(413).phrase,
                             "status": 413,
                             "detail": f"request body exceeds {self.limit} bytes"})
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/problem+json")]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


class Observed:
    """Counts and times every request by route template and status
    (``casetrail_http_*``) and, when traces are exported, makes its server span,
    continuing the caller's ``traceparent`` (``POST /cases`` hands it to the case)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method: str = scope["method"]
        span = None
        if tracing.ENABLED:
            carrier = {k.decode("latin-1"): v.decode("latin-1")
                       for k, v in scope.get("headers") or []
                       if k in (b"traceparent", b"tracestate")}
            with tracing.continued(carrier):
                span = tracing.start(method, tracing.SpanKind.SERVER, {
                    "http.request.method": method, "url.path": scope.get("path", "")})
        answered = False

        async def observed(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                route = getattr(scope.get("route"), "path", None) or "(unmatched)"
                status = int(message["status"])
                metrics.HTTP_REQUESTS.labels(method, route, str(status)).inc()
                metrics.HTTP_SECONDS_HISTOGRAM.labels(method, route).observe(
                    time.perf_counter() - started)
                if span is not None:
                    span.update_name(f"{method} {route}")
                    span.set_attributes({"http.route": route,
                                         "http.response.status_code": status})
                    if status >= 500:
                        tracing.failed(span, str(status))
            await send(message)

        try:
            with tracing.current(span):
                await self.app(scope, receive, observed)
        finally:
            if span is not None:
                span.end()
