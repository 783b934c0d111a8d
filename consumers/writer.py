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

from casetrail.adapters.store import locked_cases_cte, translate_errors
from casetrail.contract.events import (
    ENDED_SQL,
    PARKING_EVENT_TYPE,
    RUNNING_EVENT_TYPES,
    TERMINAL_EVENT_TYPES,
    CaseStatus,
    SignedEvent,
    sql_list,
    status_for,
)

_LOCK_RETRIES = 5

# One statement: insert what is new, then fold only the newly inserted rows
# into their cases (so a redelivered event never counts twice). Terminal
# statuses are sticky, so events arriving out of order cannot reopen a case; the
# other statuses (and a waiting case's answer) follow a batch only when its latest
# event is later than the one the row took them from (``folded_attempt``,
# ``folded_seq``): another consumer may have folded a later event already.
# Several consumers may fold into the same cases at once, so the case rows are
# locked in one order (case id) before any is updated: ``locked`` is read through
# an uncorrelated ARRAY(...) sub-select, which Postgres runs once, before the
# update's first row, and two batches never wait on each other in a cycle.
_TERMINAL = sql_list(sorted(TERMINAL_EVENT_TYPES))
_RUNNING = sql_list(RUNNING_EVENT_TYPES)
_PARKED = sql_list((PARKING_EVENT_TYPE,))
_CYCLE = sql_list(("REACT_CYCLE",))
_STARTED = sql_list(("CASE_STARTED",))
_COMPLETED = sql_list(("CASE_COMPLETED",))
# Evaluated against the row as locked (the latest committed), not a snapshot: a later
# event folded meanwhile by another consumer keeps the row as it is.
_LATER = ("(c.folded_attempt IS NULL OR (f.last_attempt, f.last_seq) "
          "> (c.folded_attempt, c.folded_seq))")
_STATUS_OF_TERMINAL = "CASE f.terminal_type " + " ".join(
    f"WHEN {sql_list((t,))} THEN '{status_for(t)}'" for t in sorted(TERMINAL_EVENT_TYPES)
) + " END"
_INSERT_AND_FOLD = f"""
WITH incoming AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::int[], $5::text[],
                         $6::timestamptz[], $7::smallint[], $8::text[], $9::text[],
                         $10::text[], $11::text[], $12::text[], $13::text[], $14::bytea[])
        AS r(event_id, case_id, attempt, seq, event_type, occurred_at, schema_version, payload,
             tenant_id, prev_hash, hash, key_id, sig, body)
), {locked_cases_cte("$2")}, inserted AS (
    INSERT INTO event_log (event_id, case_id, attempt, seq, event_type, occurred_at,
                           schema_version, payload, tenant_id, prev_hash, hash, key_id, sig,
                           body)
    SELECT event_id, case_id, attempt, seq, event_type, occurred_at, schema_version,
           payload::jsonb, tenant_id, prev_hash, hash, key_id, sig, body
    FROM incoming
    ON CONFLICT DO NOTHING
    RETURNING event_id, case_id, attempt, seq, event_type, occurred_at, payload
), folded AS (
    SELECT case_id,
           count(*) FILTER (WHERE event_type = {_CYCLE}) AS cycles,
           coalesce(sum((payload -> 'tokenUsage' ->> 'inputTokens')::bigint)
                    FILTER (WHERE event_type = {_CYCLE}), 0) AS input_tokens,
           coalesce(sum((payload -> 'tokenUsage' ->> 'outputTokens')::bigint)
                    FILTER (WHERE event_type = {_CYCLE}), 0) AS output_tokens,
           bool_or(event_type IN ({_RUNNING})) AS running,
           min(occurred_at) FILTER (WHERE event_type = {_STARTED}) AS started_at,
           (array_agg(event_type ORDER BY attempt DESC, seq DESC)
                FILTER (WHERE event_type IN ({_TERMINAL})))[1]
               AS terminal_type,
           (array_agg(payload ORDER BY attempt DESC, seq DESC)
                FILTER (WHERE event_type IN ({_TERMINAL})))[1]
               AS terminal_payload,
           (array_agg(event_type ORDER BY attempt DESC, seq DESC))[1] AS last_type,
           (array_agg(payload ORDER BY attempt DESC, seq DESC))[1] AS last_payload,
           (array_agg(attempt ORDER BY attempt DESC, seq DESC))[1] AS last_attempt,
           (array_agg(seq ORDER BY attempt DESC, seq DESC))[1] AS last_seq,
           max(occurred_at) AS last_at
    FROM inserted
    GROUP BY case_id
), updated AS (
    UPDATE cases c SET
        cycles = c.cycles + f.cycles,
        input_tokens = c.input_tokens + f.input_tokens,
        output_tokens = c.output_tokens + f.output_tokens,
        status = CASE
            WHEN c.status IN ({ENDED_SQL}) THEN c.status
            WHEN f.terminal_type IS NOT NULL THEN ({_STATUS_OF_TERMINAL})
            WHEN NOT {_LATER} THEN c.status
            WHEN f.last_type = {_PARKED} THEN '{CaseStatus.AWAITING_REVIEW.value}'
            WHEN f.running THEN '{CaseStatus.RUNNING.value}'
            ELSE c.status END,
        -- A case waiting for a person shows the agent's answer and checks; its
        -- terminal event's replace them (the reviewed decision).
        answer = CASE
            WHEN c.status IN ({ENDED_SQL}) THEN c.answer
            WHEN f.terminal_type = {_COMPLETED} THEN f.terminal_payload -> 'answer'
            WHEN f.terminal_type IS NOT NULL THEN NULL
            WHEN f.last_type = {_PARKED} AND {_LATER}
                THEN f.last_payload -> 'answer'
            ELSE c.answer END,
        outcome = CASE
            WHEN c.status IN ({ENDED_SQL}) THEN c.outcome
            WHEN f.terminal_type IS NOT NULL THEN f.terminal_payload - 'answer'
            WHEN f.last_type = {_PARKED} AND {_LATER} THEN f.last_payload - 'answer'
            ELSE c.outcome END,
        folded_attempt = CASE WHEN {_LATER} THEN f.last_attempt ELSE c.folded_attempt END,
        folded_seq = CASE WHEN {_LATER} THEN f.last_seq ELSE c.folded_seq END,
        started_at = coalesce(c.started_at, f.started_at),
        ended_at = CASE WHEN c.ended_at IS NULL AND f.terminal_type IS NOT NULL
                        THEN f.last_at ELSE c.ended_at END,
        updated_at = now()
    FROM folded f
    WHERE c.case_id = f.case_id AND c.case_id = ANY (ARRAY(SELECT case_id FROM locked))
    RETURNING c.case_id
)
SELECT event_id FROM inserted
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
        # and the fold into cases commit together or not at all. The conflict check
        # only reads rows that were already committed, so it needs no transaction.
        for attempt in range(1, _LOCK_RETRIES + 1):
            async with translate_errors(), self._pool.acquire() as conn:
                try:
                    rows = await conn.fetch(_INSERT_AND_FOLD, *columns)
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
