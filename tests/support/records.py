"""Records a test makes or breaks: a superuser's edits of the log, API keys with chosen
scopes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from casetrail.adapters.store import ApiKeyStore

RESTATES_BODY = ("CHECK (event_log_restates_body(body, payload, event_id, case_id, attempt, "
                 "seq, event_type, tenant_id, occurred_at, schema_version, prev_hash, hash))")
"""The log's constraint that its columns restate the signed bytes (migration 033)."""


@asynccontextmanager
async def without_body_constraint(conn: Any) -> AsyncIterator[Any]:
    """Within ``conn``'s transaction, the constraint that holds the log's columns to the
    signed bytes dropped, then put back NOT VALID, so the rows written meanwhile are
    not checked again (what the owner can do, with DDL)."""
    await conn.execute("ALTER TABLE event_log DROP CONSTRAINT event_log_restates_body")
    yield conn
    await conn.execute(f"ALTER TABLE event_log ADD CONSTRAINT event_log_restates_body "
                       f"{RESTATES_BODY} NOT VALID")


@asynccontextmanager
async def _unchecked(pool: asyncpg.Pool) -> AsyncIterator[Any]:
    """A transaction of its own, without the body constraint."""
    async with pool.acquire() as conn, conn.transaction(), without_body_constraint(conn):
        yield conn


async def tamper(pool: asyncpg.Pool, sql: str, *args: Any) -> None:
    """What a database superuser can do: switch the append-only triggers off (they fire
    even in replica mode, ENABLE ALWAYS), drop the constraint that holds the columns to
    the signed bytes, edit, and put both back."""
    async with _unchecked(pool) as conn:
        await conn.execute("ALTER TABLE event_log DISABLE TRIGGER event_log_no_update_or_delete")
        await conn.execute(sql, *args)
        await conn.execute(
            "ALTER TABLE event_log ENABLE ALWAYS TRIGGER event_log_no_update_or_delete")


def seeded_events(rows: str) -> str:
    """An INSERT of made-up events shaped as the consumer stores signed ones, so the log's
    constraint takes them: ``rows`` is a query giving ``event_id, case_id, attempt, seq,
    event_type, occurred_at, payload, tenant_id, prev_hash, key_id, sig``; the body is
    the envelope those columns restate, the hash SHA-256(prev_hash LF body). The
    signatures are not real: such events never verify, they only fill the log."""
    return f"""
INSERT INTO event_log (event_id, case_id, attempt, seq, event_type, occurred_at,
                       schema_version, payload, tenant_id, prev_hash, hash, key_id, sig, body)
SELECT event_id, case_id, attempt, seq, event_type, occurred_at, 2, payload, tenant_id,
       prev_hash, encode(sha256(convert_to(prev_hash, 'UTF8') || '\\x0a'::bytea || body),
                         'hex'), key_id, sig, body
FROM (SELECT r.*, convert_to(jsonb_build_object(
          'eventId', r.event_id, 'caseId', r.case_id, 'attempt', r.attempt, 'seq', r.seq,
          'eventType', r.event_type, 'occurredAt', r.occurred_at, 'schemaVersion', 2,
          'tenantId', r.tenant_id, 'payload', r.payload)::text, 'UTF8') AS body
      FROM ({rows}) AS r(event_id, case_id, attempt, seq, event_type, occurred_at, payload,
                         tenant_id, prev_hash, key_id, sig)) AS shaped
"""


async def as_legacy_row(pool: asyncpg.Pool, sql: str, *args: Any) -> None:
    """Store a row as a schema before 33 did (an unsigned version-1 event, say), which
    the constraint added NOT VALID left as it was."""
    async with _unchecked(pool) as conn:
        await conn.execute(sql, *args)


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
