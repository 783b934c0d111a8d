"""What a person reads of a case beside its answer: the business keys people know it by
(``case_keys``: the values stored in clear; a sensitive key is kept only as a digest and
is not shown) and the tool calls the answer rests on, from the recorded cycles."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson

from casetrail.adapters.store.pool import translate_errors


async def business_keys(pool: asyncpg.Pool, case_ids: Sequence[uuid.UUID]
                        ) -> dict[uuid.UUID, dict[str, str]]:
    """Each case's business keys in clear, ``field → value``, for a page of cases."""
    if not case_ids:
        return {}
    async with translate_errors():
        rows = await pool.fetch(
            "SELECT case_id, field, value FROM case_keys WHERE case_id = ANY($1::uuid[]) "
            "AND value IS NOT NULL ORDER BY case_id, field", list(case_ids))
    found: dict[uuid.UUID, dict[str, str]] = {}
    for row in rows:
        found.setdefault(row["case_id"], {})[row["field"]] = row["value"]
    return found


async def recorded_tool_calls(pool: asyncpg.Pool, case_id: uuid.UUID) -> list[dict[str, Any]]:
    """The case's tool calls, in the order they were made (a cycle recorded by two
    attempts counts once: the later attempt's)."""
    async with translate_errors():
        rows = await pool.fetch(
            """SELECT DISTINCT ON (cycle, call) cycle, call, body FROM (
                   SELECT (e.payload ->> 'cycleIndex')::int AS cycle,
                          t.ordinal AS call, t.body, e.attempt
                   FROM event_log e
                   CROSS JOIN LATERAL jsonb_array_elements(e.payload -> 'toolCalls')
                        WITH ORDINALITY AS t(body, ordinal)
                   WHERE e.case_id = $1 AND e.event_type = 'REACT_CYCLE') calls
               ORDER BY cycle, call, attempt DESC""", case_id)
    shown = []
    for row in rows:
        body = orjson.loads(row["body"]) if isinstance(row["body"], str | bytes) else row["body"]
        shown.append({"cycle": row["cycle"], "toolName": body.get("toolName"),
                      "toolArgs": body.get("toolArgs"),
                      **({"error": body["error"]} if body.get("error") is not None
                         else {"toolResult": body.get("toolResult")}),
                      **({"mcpServer": body["mcp"]["server"]} if body.get("mcp") else {})})
    return shown
