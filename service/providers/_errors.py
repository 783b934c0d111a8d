"""Translating provider HTTP failures into the project's error kinds.

429, 408, 409 and 5xx, timeouts and connection failures are transient
(``ModelUnavailable``, with the server's ``Retry-After`` when it sent one);
other 4xx (bad request, auth, permission, not found) are permanent
(``ModelRejected``). What reaches an event, a log or a response is scrubbed: an
authentication or permission failure becomes a fixed text (providers echo part of
the key they were given), and anything shaped like a credential in other messages
is replaced, before the message is cut to a bounded length.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

from casetrail.errors import ModelRejected, ModelUnavailable, scrub

FIXED_TEXTS = {
    401: "authentication failed: the provider refused the configured API key",
    403: "permission denied: the configured API key may not use this model or endpoint",
}
TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, ``retry-after`` as
    seconds or as an HTTP date."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        return max(0.0, email.utils.mktime_tz(parsed) - time.time())


def _message(body: Any, fallback: str) -> str:
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    return fallback


def status_error(provider: str, status: int, headers: Mapping[str, str] | None, body: Any,
                 fallback: str) -> ModelUnavailable | ModelRejected:
    detail = FIXED_TEXTS.get(status) or scrub(_message(body, fallback))
    message = f"{provider} answered {status}: {detail}"
    if status in TRANSIENT_STATUSES or status >= 500:
        return ModelUnavailable(message, retry_after=retry_after(headers))
    return ModelRejected(message)
