"""Log lines as records: every line carries ``component``, ``case_id``, ``tenant`` and
``attempt`` as fields, bound once (the component when it starts, a case's when its
attempt starts) and kept in context variables, so a task the attempt starts carries them
too. Human-readable by default (the fields after the message, ``key=value``); one JSON
object a line with ``CASETRAIL_LOG_FORMAT=json``.

Only identifiers are bound: a case's sensitive values are never a field, and the JSON
form adds nothing to a message but these fields and the exception's traceback.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

import orjson

LogFormat = Literal["text", "json"]

FIELDS = ("component", "case_id", "tenant", "attempt")
"""What every record carries (``None`` where nothing is bound)."""

_NOTHING: dict[str, str | int] = {}
_bound: ContextVar[dict[str, str | int]] = ContextVar("casetrail_log_fields",
                                                      default=_NOTHING)
_component: str | None = None


def set_component(name: str) -> None:
    """The process's component (api, worker, consumer, ...), on every line from now on."""
    global _component  # noqa: PLW0603 - one component a process, set as it starts
    _component = name


@contextmanager
def bound(**fields: str | int | None) -> Iterator[None]:
    """Within the block (and in the tasks started in it), records carry ``fields``:
    ``case_id``, ``tenant``, ``attempt``."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"not a log field: {sorted(unknown)}; the fields are {FIELDS}")
    token = _bound.set(_bound.get() | {k: v for k, v in fields.items() if v is not None})
    try:
        yield
    finally:
        _bound.reset(token)


class ContextFields(logging.Filter):
    """Puts the bound fields on each record (a handler's filter: every logger's records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _bound.get()
        record.component = _component
        record.case_id = fields.get("case_id")
        record.tenant = fields.get("tenant")
        record.attempt = fields.get("attempt")
        return True


class TextFormatter(logging.Formatter):
    """``time level logger: message  component=… case_id=…`` (the fields that are set)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{k}={v}" for k in FIELDS
                          if (v := getattr(record, k, None)) is not None)
        if not fields:
            return text
        first, newline, rest = text.partition("\n")  # after the message, before a traceback
        return f"{first}  {fields}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the fields, the exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        line |= {k: v for k in FIELDS if (v := getattr(record, k, None)) is not None}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure(level: str, form: LogFormat = "text") -> None:
    """Every record to standard error, in ``form``, with the bound fields. Like
    ``logging.basicConfig``, it leaves alone a root logger someone else gave handlers."""
    root = logging.getLogger()
    if any(not isinstance(h, _Handler) for h in root.handlers):
        return
    for old in root.handlers[:]:
        root.removeHandler(old)
    handler = _Handler(sys.stderr)
    handler.setFormatter(JsonFormatter() if form == "json" else TextFormatter())
    handler.addFilter(ContextFields())
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
    logging.getLogger("aiormq").setLevel(logging.WARNING)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """casetrail's own handler (``configure`` replaces it, and nothing else)."""
