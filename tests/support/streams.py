"""A case's live stream (server-sent events), read as a client would."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Sse:
    id: str | None
    event: str | None
    data: dict[str, Any]


@dataclass
class Received:
    events: list[Sse]
    comments: list[str]


async def read_stream(client: httpx.AsyncClient, path: str, *, last_event_id: str | None = None,
                      until: int | None = None, comments_until: int | None = None
                      ) -> Received:
    """Read an event stream until the server ends it, or ``until`` events (or
    ``comments_until`` comment lines) arrived."""
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    got = Received([], [])
    async with client.stream("GET", path, headers=headers, timeout=30) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line.startswith(":"):
                got.comments.append(line)
                if comments_until is not None and len(got.comments) >= comments_until:
                    return got
            elif line:
                name, _, value = line.partition(": ")
                fields[name] = value
            elif "data" in fields:
                got.events.append(Sse(fields.get("id"), fields.get("event"),
                                      json.loads(fields["data"])))
                fields = {}
                if until is not None and len(got.events) >= until:
                    return got
    return got
