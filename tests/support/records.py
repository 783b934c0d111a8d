"""Records a test makes or breaks: a superuser's edits of the log, API keys with chosen
scopes."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from casetrail.adapters.store import ApiKeyStore


async def tamper(pool: asyncpg.Pool, sql: str, *args: Any) -> None:
    """What a database superuser can do: switch the append-only triggers off (they fire
    even in replica mode, ENABLE ALWAYS), edit, and switch them back on."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("ALTER TABLE event_log DISABLE TRIGGER event_log_no_update_or_delete")
        await conn.execute(sql, *args)
        await conn.execute(
            "ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_no_update_or_delete")


async def forge_tool_result(pool: asyncpg.Pool, case_id: uuid.UUID, seq: int) -> None:
    """A superuser rewrites the first tool result of event ``seq`` in its signed bytes
    (the queried ``payload`` column left as it was)."""
    await tamper(pool, "UPDATE event_log SET body = convert_to(replace(convert_from(body, "
                       "'UTF8'), '\"toolResult\":{', '\"toolResult\":{\"forged\":1,'), 'UTF8') "
                       "WHERE case_id = $1 AND seq = $2", case_id, seq)


SUSPECT = {"customerId": "C-4711", "customerName": "Ivan Petrov", "country": "RU",
           "transfers": [{"amount": 9500, "counterpartyCountry": "CY", "date": "2026-11-02"}]}


async def key_with(pool: asyncpg.Pool, *scopes: str) -> dict[str, str]:
    _, key = await ApiKeyStore(pool).create("default", scopes, "sensitive tests")
    return {"Authorization": f"Bearer {key}"}
