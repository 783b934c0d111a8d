"""Writes batches of events into ``event_log`` and keeps ``cases`` current, in one
transaction per batch.

Inserts are idempotent (``ON CONFLICT DO NOTHING`` on the event id, which is
derived from ``(caseId, attempt, seq)``). A duplicate whose signed bytes differ
from the stored row's (another hash) is reported as a conflict, never dropped
silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from casetrail.adapters.store import translate_errors
from casetrail.contract.events import SignedEvent

_LOCK_RETRIES = 5

# One statement: insert what is new. The database derives the rest from what was
# inserted, in the same statement, with the owner's authority (migration 033): each
# row's columns are held to its signed bytes (a CHECK constraint), and the owner's
# trigger folds the newly inserted rows (never a redelivered one) into their cases, so
# this role holds no UPDATE on ``cases`` and cannot write what people are shown.
_INSERT = """
INSERT INTO event_log (event_id, case_id, attempt, seq, event_type, occurred_at,
                       schema_version, payload, tenant_id, prev_hash, hash, key_id, sig, body)
SELECT event_id, case_id, attempt, seq, event_type, occurred_at, schema_version,
       payload::jsonb, tenant_id, prev_hash, hash, key_id, sig, body
FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::int[], $5::text[], $6::timestamptz[],
            $7::smallint[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[],
            $13::text[], $14::bytea[])
    AS r(event_id, case_id, attempt, seq, event_type, occurred_at, schema_version, payload,
         tenant_id, prev_hash, hash, key_id, sig, body)
ON CONFLICT DO NOTHING
RETURNING event_id
"""

_CONFLICTS = """
SELECT r.idx
FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int[])
    AS r(case_id, event_id, hash, idx)
JOIN event_log e USING (case_id, event_id)
WHERE e.hash IS DISTINCT FROM r.hash
"""


@dataclass(frozen=True)
class BatchOutcome:
    """What one batch did: how many rows were new, which events conflict (by index)."""

    inserted: int
    duplicates: int
    conflicts: dict[int, str]


class EventLogWriter:
    """Persists events; each call to ``write`` is one transaction."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def write(self, signed: Sequence[SignedEvent]) -> BatchOutcome:
        """Store ``signed`` events once each, exactly as signed, and fold them into
        ``cases``; commit; report.

        Raises ``StoreUnavailable`` when Postgres cannot be reached (nothing
        committed), and lets other database errors through for the caller to
        isolate the event that caused them.
        """
        if not signed:
            return BatchOutcome(0, 0, {})
        events = [s.event for s in signed]
        columns = (
            [e.event_id for e in events],
            [e.case_id for e in events],
            [e.attempt for e in events],
            [e.seq for e in events],
            [e.event_type for e in events],
            [e.occurred_at for e in events],
            [e.schema_version for e in events],
            [s.payload for s in signed],
            [e.tenant_id for e in events],
            [s.integrity.prev_hash for s in signed],
            [s.integrity.hash for s in signed],
            [s.integrity.key_id for s in signed],
            [s.integrity.sig for s in signed],
            [s.body for s in signed],
        )
        # One statement, so one implicit transaction and one round trip: the insert
        # and the owner's fold into cases commit together or not at all. The conflict check
        # only reads rows that were already committed, so it needs no transaction.
        for attempt in range(1, _LOCK_RETRIES + 1):
            async with translate_errors(), self._pool.acquire() as conn:
                try:
                    rows = await conn.fetch(_INSERT, *columns)
                    conflicts: dict[int, str] = {}
                    if len(rows) < len(events):
                        conflicts = await self._conflicts(conn, signed, rows)
                except (asyncpg.DeadlockDetectedError, asyncpg.SerializationError):
                    # Only possible between concurrent batches holding the same new
                    # events; the statement rolled back, so run it again.
                    if attempt == _LOCK_RETRIES:
                        raise
                    continue
                except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                        asyncpg.exceptions.InternalClientError):
                    # Never hand a connection in an unknown state back to the pool.
                    conn.terminate()
                    raise
            return BatchOutcome(len(rows), len(events) - len(rows) - len(conflicts), conflicts)
        raise AssertionError("unreachable")

    async def _conflicts(
        self,
        conn: Any,
        signed: Sequence[SignedEvent],
        inserted: list[asyncpg.Record],
    ) -> dict[int, str]:
        events = [s.event for s in signed]
        new = {row["event_id"] for row in inserted}
        first_seen: dict[object, int] = {}
        candidates = []
        for index, event in enumerate(events):
            if event.event_id in new and event.event_id not in first_seen:
                first_seen[event.event_id] = index  # this copy was the one stored
                continue
            candidates.append(index)
        if not candidates:
            return {}
        rows = await conn.fetch(
            _CONFLICTS,
            [events[i].case_id for i in candidates],
            [events[i].event_id for i in candidates],
            [signed[i].integrity.hash for i in candidates],
            candidates,
        )
        return {
            row["idx"]: (
                f"conflict: event {events[row['idx']].event_id} (case "
                f"{events[row['idx']].case_id}, attempt {events[row['idx']].attempt}, seq "
                f"{events[row['idx']].seq}) is already stored with different content"
            )
            for row in rows
        }
