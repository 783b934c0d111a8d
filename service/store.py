"""Postgres adapter for the API and the workers: cases, claims, and the auditor's query.

Only this module and the event-log writer speak SQL. asyncpg's exceptions are
translated here: a lost or refused connection becomes ``StoreUnavailable``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg
import orjson
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from service.auth import ApiKeyRecord, key_hash, new_key
from service.config import Identity
from service.errors import PermanentError, StoreUnavailable
from service.events import (
    ENDED_STATUSES,
    EVENT_TYPES,
    PARKING_EVENT_TYPE,
    TERMINAL_EVENT_TYPES,
    CaseStatus,
    sql_statuses,
)
from service.integrity import Integrity, public_key_text
from service.sensitive import SealedValues, Vault
from service.verification import PublicKey

_ENDED = sql_statuses(ENDED_STATUSES)
_ACTIVE = sql_statuses((CaseStatus.QUEUED, CaseStatus.RUNNING))

_TRANSIENT = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    # A connection left mid-operation by a server that went away reports this on
    # its next use; a fresh connection cures it.
    asyncpg.exceptions.InternalClientError,
)


@asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    """Turn connection-level asyncpg failures into ``StoreUnavailable``."""
    try:
        yield
    except _TRANSIENT as exc:
        raise StoreUnavailable(f"Postgres unavailable: {type(exc).__name__}: {exc}") from exc


async def _init_connection(conn: asyncpg.Connection) -> None:
    for kind in ("json", "jsonb"):
        await conn.set_type_codec(
            kind, encoder=lambda v: orjson.dumps(v).decode(), decoder=orjson.loads,
            schema="pg_catalog",
        )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Reset on release: nothing beyond asyncpg's own rollback of an open transaction.

    Pooled connections never change session state (no SET, LISTEN, advisory locks
    or cursors: migrations use a connection of their own), so asyncpg's default
    reset query would cost a round trip and server work on every release for nothing.
    """


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10,
                      name: str = "casetrail-admin") -> asyncpg.Pool:
    """A pool whose sessions say who they are (``application_name``)."""
    async with translate_errors():
        pool = await asyncpg.create_pool(
            url, min_size=min_size, max_size=max_size, init=_init_connection,
            reset=_keep_session, server_settings={"application_name": name},
        )
    assert pool is not None
    return pool


async def component_pool(identity: Identity, size: int,
                         patience: float | None = None) -> asyncpg.Pool:
    """A component's pool, as its own role (``casetrail-<component>`` in
    ``pg_stat_activity``); refuses a role that is a superuser."""
    pool = await pool_patiently(identity.database, size, name=f"casetrail-{identity.component}",
                                patience=STARTUP_PATIENCE_SECONDS if patience is None
                                else patience)
    if await pool.fetchval("SELECT current_setting('is_superuser') = 'on'"):
        await pool.close()
        raise PermanentError(f"the {identity.component}'s database role is a superuser: "
                             "components run with the least privilege (casetrail setup)")
    return pool


STARTUP_PATIENCE_SECONDS = 60.0
"""How long a component waits for the database to answer at start."""


async def pool_patiently(url: str, size: int, patience: float = STARTUP_PATIENCE_SECONDS,
                         name: str = "casetrail-admin") -> asyncpg.Pool:
    """A pool, waiting up to ``patience`` seconds for the database at start-up."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(StoreUnavailable), wait=wait_fixed(1),
        stop=stop_after_delay(patience), reraise=True,
    ):
        with attempt:
            return await create_pool(url, max_size=size, name=name)
    raise AssertionError("unreachable")


def _claim_from_row(row: asyncpg.Record) -> Claim:
    outcome = row["outcome"]
    if outcome in ("ended", "busy", "parked"):
        return Claim(outcome)
    sealed = None if row["wrapped_key"] is None else SealedValues(
        row["master_key_id"], bytes(row["wrapped_key"]), bytes(row["ciphertext"]))
    recorded = RecordedCase(row["agent"], row["tenant_id"], row["input"], row["model"],
                            row["limits"], row["started_by"], sealed)
    if outcome == "cancel_queued":
        return Claim("cancel_queued", attempt=1, cancel_reason=row["cancel_reason"],
                     cancelled_by=row["cancelled_by"], case=recorded)
    attempt = row["attempt"]
    restart = None
    if attempt > 1:
        restart = (
            f"attempt {attempt - 1} (worker {row['previous_owner']}) stopped without a "
            "terminal event; its start command was redelivered"
        )
    action = None if row["action_kind"] is None else ParkedAction(
        row["action_attempt"], row["action_kind"], row["verdict"], row["action_reason"],
        row["decision"], row["reviewer"], row["acted_at"])
    return Claim(
        "run", attempt=attempt, cancel_reason=row["cancel_reason"], restart_reason=restart,
        cancelled_by=row["cancelled_by"], case=recorded, action=action,
    )


_EVENT_COLUMNS = ("event_id, case_id, tenant_id, attempt, seq, event_type, occurred_at, "
                  "recorded_at, schema_version, payload, prev_hash, hash, key_id, sig")


@dataclass(frozen=True)
class StoredEvent:
    """One row of ``event_log`` as the trail shows it."""

    event_id: uuid.UUID
    case_id: uuid.UUID
    tenant_id: str
    attempt: int
    seq: int
    event_type: str
    occurred_at: datetime
    recorded_at: datetime
    schema_version: int
    payload: dict[str, Any]
    prev_hash: str | None = None
    hash: str | None = None
    key_id: str | None = None
    sig: str | None = None
    body: bytes | None = None

    @property
    def integrity(self) -> Integrity | None:
        if self.hash is None or self.prev_hash is None or self.key_id is None \
                or self.sig is None:
            return None
        return Integrity(self.prev_hash, self.hash, self.key_id, self.sig)

    def columns(self) -> dict[str, Any]:
        """The queried columns, named as in the envelope (compared with the signed body)."""
        return {
            "eventId": str(self.event_id),
            "caseId": str(self.case_id),
            "tenantId": self.tenant_id,
            "eventType": self.event_type,
            "occurredAt": self.occurred_at,
            "schemaVersion": self.schema_version,
            "payload": self.payload,
        }

    def as_json(self) -> dict[str, Any]:
        """The envelope form (camelCase), as on the bus, with its ``integrity`` (``None``
        for a version-1 event) and ``recordedAt``."""
        integrity = self.integrity
        return {
            "eventId": str(self.event_id),
            "caseId": str(self.case_id),
            "tenantId": self.tenant_id,
            "attempt": self.attempt,
            "seq": self.seq,
            "eventType": self.event_type,
            "occurredAt": self.occurred_at.isoformat().replace("+00:00", "Z"),
            "recordedAt": self.recorded_at.isoformat().replace("+00:00", "Z"),
            "schemaVersion": self.schema_version,
            "payload": self.payload,
            "integrity": integrity.as_json() if integrity else None,
        }


@dataclass(frozen=True)
class NewCase:
    case_id: uuid.UUID
    agent: str
    input: dict[str, Any]
    model: dict[str, Any]
    limits: dict[str, Any]
    request_digest: str
    idempotency_key: str | None
    tenant_id: str = "default"
    started_by: str | None = None
    sealed: SealedValues | None = None
    """The input's sensitive values, sealed (``input`` holds their placeholders)."""
    placeholders: tuple[str, ...] = ()
    keys: tuple[tuple[str, str, bool], ...] = ()
    """Its business keys: ``(field, value or digest, is a digest)``."""


ClaimOutcome = Literal["run", "ended", "busy", "cancel_queued", "parked", "unknown"]

# Claims of many cases, decided and recorded in one statement (one round trip,
# one implicit transaction; the row locks, taken in case-id order like the
# consumer's, are held while the decisions are made and written).
_CLAIM = f"""
WITH current AS MATERIALIZED (
    SELECT case_id, status, attempts_claimed, lease_owner, terminal_published,
           cancel_requested_at, cancel_reason, cancelled_by,
           agent, tenant_id, input, model, limits, started_by, parked_attempt,
           lease_expires_at > now() AS lease_live
    FROM cases WHERE case_id = ANY($1::uuid[]) ORDER BY case_id FOR UPDATE
), decided AS (
    SELECT c.*, a.parked_attempt AS action_attempt, a.kind AS action_kind, a.verdict,
           a.reason AS action_reason, a.decision,
           a.reviewer, a.acted_at, CASE
        WHEN c.terminal_published
             OR c.status IN ({_ENDED})
             OR EXISTS (SELECT 1 FROM event_log e WHERE e.case_id = c.case_id
                        AND e.event_type = ANY($2::text[])) THEN 'ended'
        WHEN c.lease_live AND c.lease_owner IS DISTINCT FROM $3 THEN 'busy'
        WHEN c.cancel_requested_at IS NOT NULL AND c.attempts_claimed = 0 THEN 'cancel_queued'
        -- waiting for a person, and nobody has acted on this wait yet: nothing to run
        WHEN c.parked_attempt IS NOT NULL
             AND (a.kind IS NULL OR a.parked_attempt < c.parked_attempt)
             AND c.cancel_requested_at IS NULL THEN 'parked'
        ELSE 'run' END AS outcome
    FROM current c
         -- what a person did about the latest wait (it may be noted here after the
         -- action: the worker applies an action only to the wait it was taken on)
         LEFT JOIN LATERAL (SELECT * FROM case_actions a WHERE a.case_id = c.case_id
                            ORDER BY a.parked_attempt DESC LIMIT 1) a ON true
), claimed AS (
    UPDATE cases SET attempts_claimed = d.attempts_claimed + 1, lease_owner = $3,
                     lease_expires_at = now() + make_interval(secs => $4)
    FROM decided d
    WHERE cases.case_id = d.case_id AND d.outcome IN ('run', 'cancel_queued')
    RETURNING cases.case_id, cases.attempts_claimed
)
SELECT d.case_id, d.outcome, d.cancel_reason, d.cancelled_by,
       d.agent, d.tenant_id, d.input, d.model, d.limits, d.started_by,
       d.lease_owner AS previous_owner, d.action_attempt, d.action_kind, d.verdict,
       d.action_reason, d.decision, d.reviewer, d.acted_at,
       c.attempts_claimed AS attempt,
       s.master_key_id, s.wrapped_key, s.ciphertext
FROM decided d LEFT JOIN claimed c USING (case_id)
     LEFT JOIN case_secrets s ON s.case_id = d.case_id AND d.outcome = 'run'
"""


# Statements that change several cases rows lock them first, in case-id order, as
# the claim and the consumer's fold do: two of them never wait on each other in a
# cycle (a deadlock).
def locked_cases_cte(ids: str) -> str:
    """``locked AS (...)``: a CTE that locks the cases rows whose ids are in the array
    parameter ``ids`` (e.g. ``"$1"``), in case-id order. Read it before updating them."""
    return (f"locked AS MATERIALIZED (SELECT case_id FROM cases WHERE case_id = "
            f"ANY({ids}::uuid[]) ORDER BY case_id FOR UPDATE)")


_LOCKED_IN_ORDER = "WITH " + locked_cases_cte("$1")


@dataclass(frozen=True)
class RecordedCase:
    """A case as the API recorded it: what a worker runs (never the start command's word)."""

    agent: str
    tenant_id: str
    input: dict[str, Any]
    model: dict[str, Any]
    limits: dict[str, Any]
    started_by: str | None
    sealed: SealedValues | None = None
    """Its sensitive values, sealed (read with the claim: one round trip, not two)."""


@dataclass(frozen=True)
class TrailHead:
    """A case's last stored event, where an administrative event is chained on."""

    attempt: int
    seq: int
    hash: str
    event_type: str
    tenant_id: str
    """The case's tenant as its signed trail records it."""
    erased: bool
    """A CASE_ERASED is among the case's events."""


@dataclass(frozen=True)
class ParkedAction:
    """What a person did about a case waiting for one (``case_actions``): the worker
    records it and goes on."""

    parked_attempt: int
    kind: Literal["review", "answer", "cancel"]
    verdict: str | None
    reason: str | None
    decision: dict[str, Any] | None
    reviewer: dict[str, Any] | None
    acted_at: datetime


@dataclass(frozen=True)
class Claim:
    """What a worker may do with a start command it received."""

    outcome: ClaimOutcome
    attempt: int = 0
    cancel_reason: str | None = None
    restart_reason: str | None = None
    cancelled_by: str | None = None
    case: RecordedCase | None = None
    action: ParkedAction | None = None
    """What a person did about the wait this case was parked in, when it was."""


class CaseStore:
    """Cases, claims on them, cancellation requests and the auditor's query."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def ping(self) -> None:
        async with translate_errors():
            await self._pool.fetchval("SELECT 1")

    async def insert_case(self, case: NewCase) -> tuple[dict[str, Any], bool]:
        """Insert a queued case; with an idempotency key already used, return that case.

        Returns ``(row, created)``.
        """
        async with translate_errors(), self._pool.acquire() as conn, conn.transaction():
            insert = """INSERT INTO cases (case_id, agent, input, model, limits, request_digest,
                                           idempotency_key, tenant_id, started_by)
                        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                        ON CONFLICT (tenant_id, idempotency_key)
                            WHERE idempotency_key IS NOT NULL DO NOTHING
                        RETURNING *"""
            args: list[Any] = [case.case_id, case.agent, case.input, case.model, case.limits,
                               case.request_digest, case.idempotency_key, case.tenant_id,
                               case.started_by]
            if case.keys:  # the keys in the same statement: no round trip more
                insert = f"""WITH inserted AS ({insert}), keyed AS (
                    INSERT INTO case_keys (case_id, tenant_id, field, value, digest, created_at)
                    SELECT i.case_id, i.tenant_id, k.field, k.value, k.digest, i.created_at
                    FROM inserted i, unnest($10::text[], $11::text[], $12::boolean[])
                                     AS k(field, value, digest))
                    SELECT * FROM inserted"""
                args += [[k[0] for k in case.keys], [k[1] for k in case.keys],
                         [k[2] for k in case.keys]]
            row = await conn.fetchrow(insert, *args)
            if row is not None:
                if case.sealed is not None:
                    await conn.execute(
                        """INSERT INTO case_secrets (case_id, master_key_id, wrapped_key,
                                                     ciphertext, placeholders)
                           VALUES ($1, $2, $3, $4, $5)""",
                        case.case_id, case.sealed.master_key_id, case.sealed.wrapped_key,
                        case.sealed.ciphertext, list(case.placeholders))
                return dict(row), True
            existing = await conn.fetchrow(
                "SELECT * FROM cases WHERE tenant_id = $1 AND idempotency_key = $2",
                case.tenant_id, case.idempotency_key,
            )
        assert existing is not None
        return dict(existing), False

    async def mark_starts_confirmed(self, case_ids: Sequence[uuid.UUID]
                                    ) -> dict[uuid.UUID, None]:
        """The broker confirmed these cases' start commands: a re-sent request publishes
        no other copy (one statement for many, through the API's coalescer)."""
        async with translate_errors():
            await self._pool.execute(
                _LOCKED_IN_ORDER + """
                UPDATE cases SET start_confirmed_at = now(), start_publishing_until = NULL
                WHERE case_id IN (SELECT case_id FROM locked)""", list(case_ids))
        return dict.fromkeys(case_ids)

    async def take_start_resend(self, case_id: uuid.UUID, lease_seconds: float) -> bool:
        """Whether a repeated request may publish this case's start command again: its
        first publish is unconfirmed, nobody claimed it, and this call took the short
        publishing lease (so concurrent re-sends publish one copy, not one each)."""
        async with translate_errors():
            taken = await self._pool.fetchval(
                f"""UPDATE cases
                   SET start_publishing_until = now() + make_interval(secs => $2)
                   WHERE case_id = $1 AND start_confirmed_at IS NULL
                     AND attempts_claimed = 0 AND status = '{CaseStatus.QUEUED.value}'
                     AND (start_publishing_until IS NULL OR start_publishing_until < now())
                   RETURNING case_id""", case_id, lease_seconds)
        return taken is not None

    async def idempotency_key_used(self, tenant: str, key: str) -> bool:
        async with translate_errors():
            return bool(await self._pool.fetchval(
                "SELECT 1 FROM cases WHERE tenant_id = $1 AND idempotency_key = $2",
                tenant, key))

    async def delete_unstarted(self, case_id: uuid.UUID) -> bool:
        """Remove a case whose start command the broker would not take (no events exist);
        ``False`` when a worker has claimed it meanwhile: the command did arrive (its
        confirm was what got lost), and the case is running."""
        async with translate_errors():
            status = await self._pool.execute(
                "DELETE FROM cases WHERE case_id = $1 AND attempts_claimed = 0", case_id
            )
        return bool(status.endswith(" 1"))

    async def get_case(self, case_id: uuid.UUID) -> dict[str, Any] | None:
        async with translate_errors():
            row = await self._pool.fetchrow("SELECT * FROM cases WHERE case_id = $1", case_id)
        return None if row is None else dict(row)

    async def find_by_case_and_types(
        self, case_id: uuid.UUID, types: Sequence[str] | None = None, *,
        with_body: bool = False,
    ) -> list[StoredEvent]:
        """The auditor's query: one case's events of the given types, in ``(attempt, seq)``
        order; ``with_body`` adds the signed bytes (to verify or export them)."""
        wanted = list(types) if types else list(EVENT_TYPES)
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""SELECT {_EVENT_COLUMNS}{", body" if with_body else ""}
                    FROM event_log
                    WHERE case_id = $1 AND event_type = ANY($2::text[])
                    ORDER BY attempt, seq""",
                case_id, wanted,
            )
        return [StoredEvent(**dict(r)) for r in rows]

    async def events_between(self, case_id: uuid.UUID, after: tuple[int, int] | None,
                             before: tuple[int, int] | None = None) -> list[StoredEvent]:
        """One case's events strictly between two ``(attempt, seq)`` keys (``None``: open
        ended), in order, read on the ``(case_id, attempt, seq)`` index."""
        low, high = after or (0, -1), before or (2**31 - 1, 0)
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""SELECT {_EVENT_COLUMNS} FROM event_log
                    WHERE case_id = $1 AND (attempt, seq) > ($2, $3)
                      AND (attempt, seq) < ($4, $5)
                    ORDER BY attempt, seq""", case_id, *low, *high)
        return [StoredEvent(**dict(r)) for r in rows]

    async def trails(self, case_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[StoredEvent]]:
        """Several cases' events at once, each case's in ``(attempt, seq)`` order."""
        found: dict[uuid.UUID, list[StoredEvent]] = {c: [] for c in case_ids}
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""SELECT {_EVENT_COLUMNS} FROM event_log WHERE case_id = ANY($1::uuid[])
                    ORDER BY case_id, attempt, seq""", list(case_ids))
        for row in rows:
            found[row["case_id"]].append(StoredEvent(**dict(row)))
        return found

    async def decided_cases(self, agent: str | None, since: datetime | None,
                            limit: int) -> list[uuid.UUID]:
        """Cases the agent decided (completed, or waiting for a person to review its
        decision), oldest first: of ``agent`` (any when ``None``), created at or after
        ``since``; at most ``limit``."""
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""SELECT case_id FROM cases
                   WHERE status IN ('{CaseStatus.COMPLETED.value}',
                                    '{CaseStatus.AWAITING_REVIEW.value}')
                     AND ($1::text IS NULL OR agent = $1)
                     AND ($2::timestamptz IS NULL OR created_at >= $2)
                   ORDER BY created_at, case_id LIMIT $3""", agent, since, limit)
        return [row["case_id"] for row in rows]

    async def claim(self, case_id: uuid.UUID, owner: str, lease_seconds: float) -> Claim:
        """Claim the next attempt of a case for ``owner``, atomically.

        ``run``: go, as ``attempt``. ``ended``: a terminal event already exists; ack.
        ``busy``: a live lease is held elsewhere (a redelivery beside a live attempt); wait.
        ``cancel_queued``: cancelled before any attempt; publish ``CASE_CANCELLED``.
        ``parked``: waiting for a person who has not acted yet; ack, run nothing.
        ``unknown``: no such case.
        """
        return (await self.claim_many([case_id], owner, lease_seconds))[case_id]

    async def claim_many(
        self, case_ids: Sequence[uuid.UUID], owner: str, lease_seconds: float
    ) -> dict[uuid.UUID, Claim]:
        """:meth:`claim` for several cases in one statement; one ``Claim`` per case id."""
        async with translate_errors():
            rows = await self._pool.fetch(
                _CLAIM, list(case_ids), list(TERMINAL_EVENT_TYPES), owner, lease_seconds
            )
        claims = {case_id: Claim("unknown") for case_id in case_ids}
        for row in rows:
            claims[row["case_id"]] = _claim_from_row(row)
        return claims

    async def renew_leases(self, case_ids: Sequence[uuid.UUID], owner: str,
                           lease_seconds: float) -> None:
        if not case_ids:
            return
        async with translate_errors():
            await self._pool.execute(
                _LOCKED_IN_ORDER + """
                UPDATE cases SET lease_expires_at = now() + make_interval(secs => $3)
                WHERE case_id IN (SELECT case_id FROM locked) AND lease_owner = $2""",
                list(case_ids), owner, lease_seconds,
            )

    async def take_stranded(self, lock_name: str, lapsed_seconds: float,
                            resend_seconds: float, limit: int = 500
                            ) -> list[tuple[uuid.UUID, str, str]]:
        """``(case_id, tenant_id, agent)`` of cases stranded: claimed, not ended, their
        lease lapsed over ``lapsed_seconds`` ago, and not re-sent in the last
        ``resend_seconds``; each is marked re-sent now. Empty unless this call holds the
        advisory lock ``lock_name`` (one sweeper at a time; the lock ends with the
        statement's transaction)."""
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""
                WITH sweeper AS MATERIALIZED (SELECT pg_try_advisory_xact_lock(hashtext($1))
                                              AS held),
                stranded AS MATERIALIZED (
                    SELECT case_id FROM cases c
                    WHERE (SELECT held FROM sweeper)
                      AND NOT terminal_published AND attempts_claimed > 0
                      -- running (after a person acted, when it waited for one), or
                      -- waiting for a person who has acted (a review, or a cancel)
                      AND (status IN ({_ACTIVE}) OR status = '{CaseStatus.AWAITING_REVIEW.value}')
                      AND (parked_attempt IS NULL
                           OR cancel_requested_at < now() - make_interval(secs => $2)
                           OR EXISTS (SELECT 1 FROM case_actions a
                                      WHERE a.case_id = c.case_id
                                        AND a.parked_attempt >= c.parked_attempt
                                        AND a.acted_at < now() - make_interval(secs => $2)))
                      AND (lease_expires_at IS NULL
                           OR lease_expires_at < now() - make_interval(secs => $2))
                      AND (start_resent_at IS NULL
                           OR start_resent_at < now() - make_interval(secs => $3))
                    ORDER BY case_id LIMIT $4 FOR UPDATE SKIP LOCKED)
                UPDATE cases SET start_resent_at = now()
                WHERE case_id IN (SELECT case_id FROM stranded)
                RETURNING case_id, tenant_id, agent""",
                lock_name, lapsed_seconds, resend_seconds, limit)
        return [(row["case_id"], row["tenant_id"], row["agent"]) for row in rows]

    async def mark_parked(self, case_id: uuid.UUID, attempt: int, due_at: datetime) -> None:
        """The worker's note that ``attempt`` ended waiting for a person (its
        ``CASE_AWAITING_REVIEW`` confirmed): the case holds no lease while it waits,
        and its review is overdue from ``due_at``. Noting the same wait again keeps
        when it began."""
        async with translate_errors():
            await self._pool.execute(
                """UPDATE cases SET parked_at = CASE WHEN parked_attempt IS NOT DISTINCT
                                                     FROM $2 THEN parked_at ELSE now() END,
                                    parked_attempt = $2, review_due_at = $3,
                                    lease_owner = NULL, lease_expires_at = NULL
                   WHERE case_id = $1""", case_id, attempt, due_at)

    async def mark_terminal_published(self, *case_ids: uuid.UUID) -> None:
        """The worker's note that these cases' terminal events are confirmed by the broker."""
        async with translate_errors():
            await self._pool.execute(
                _LOCKED_IN_ORDER + """
                UPDATE cases SET terminal_published = true, lease_owner = NULL,
                                 lease_expires_at = NULL
                WHERE case_id IN (SELECT case_id FROM locked)""",
                list(case_ids),
            )

    async def trail_head(self, case_id: uuid.UUID) -> TrailHead | None:
        """The case's last stored event; ``None`` without events."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                """SELECT attempt, seq, hash, event_type, tenant_id,
                          EXISTS (SELECT 1 FROM event_log e WHERE e.case_id = $1
                                  AND e.event_type = 'CASE_ERASED') AS erased
                   FROM event_log WHERE case_id = $1 ORDER BY attempt DESC, seq DESC
                   LIMIT 1""", case_id)
        return None if row is None else TrailHead(row["attempt"], row["seq"], row["hash"],
                                                  row["event_type"], row["tenant_id"],
                                                  row["erased"])

    async def record_action(self, case_id: uuid.UUID, kind: str, *, verdict: str | None = None,
                            reason: str | None = None, decision: dict[str, Any] | None = None,
                            reviewer: dict[str, Any] | None = None
                            ) -> Literal["recorded", "taken", "not_parked"]:
        """Keep what a person did about the case's wait (once per wait, atomically):
        ``taken`` when somebody already acted on this wait, ``not_parked`` when the case
        is not waiting (or has ended)."""
        async with translate_errors():
            # The wait is the latest: as the worker noted it, or as the consumer stored
            # its CASE_AWAITING_REVIEW (whichever is further along).
            row = await self._pool.fetchrow(
                f"""WITH waiting AS (
                        SELECT case_id, greatest(parked_attempt, (
                            SELECT max(e.attempt) FROM event_log e WHERE e.case_id = $1
                              AND e.event_type = '{PARKING_EVENT_TYPE}')) AS parked_attempt
                        FROM cases
                        WHERE case_id = $1 AND NOT terminal_published
                          AND status NOT IN ({_ENDED})),
                    kept AS (
                        INSERT INTO case_actions (case_id, parked_attempt, kind, verdict,
                                                  reason, decision, reviewer)
                        SELECT case_id, parked_attempt, $2, $3, $4, $5, $6 FROM waiting
                        WHERE parked_attempt IS NOT NULL
                        ON CONFLICT DO NOTHING RETURNING parked_attempt)
                    SELECT (SELECT count(*) FROM waiting WHERE parked_attempt IS NOT NULL)
                               AS waiting,
                           (SELECT count(*) FROM kept) AS kept""",
                case_id, kind, verdict, reason, decision, reviewer)
        assert row is not None  # an aggregate: always one row
        return "not_parked" if not row["waiting"] else "recorded" if row["kept"] else "taken"

    async def latest_wait(self, case_id: uuid.UUID) -> tuple[int, dict[str, Any]] | None:
        """``(attempt, payload)`` of the case's latest ``CASE_AWAITING_REVIEW``."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                f"""SELECT attempt, payload FROM event_log
                    WHERE case_id = $1 AND event_type = '{PARKING_EVENT_TYPE}'
                    ORDER BY attempt DESC LIMIT 1""", case_id)
        return None if row is None else (row["attempt"], row["payload"])

    async def earlier_reviewer(self, case_id: uuid.UUID, wait: int) -> str | None:
        """The person whose review, kept for a wait before ``wait``, is the latest: the
        override a ``second_review`` wait holds."""
        async with translate_errors():
            person: str | None = await self._pool.fetchval(
                """SELECT reviewer ->> 'subject' FROM case_actions
                   WHERE case_id = $1 AND parked_attempt < $2 AND kind = 'review'
                   ORDER BY parked_attempt DESC LIMIT 1""", case_id, wait)
        return person

    async def review_counts(self) -> list[tuple[str, int, int, datetime | None]]:
        """Per agent: ``(agent, waiting, overdue, oldest wait began)`` of the cases
        waiting for a person (every tenant)."""
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""SELECT agent, count(*) AS waiting,
                           count(*) FILTER (WHERE review_due_at < now()) AS overdue,
                           min(parked_at) AS oldest
                    FROM cases WHERE status = '{CaseStatus.AWAITING_REVIEW.value}'
                    GROUP BY agent""")
        return [(r["agent"], r["waiting"], r["overdue"], r["oldest"]) for r in rows]

    async def person_of(self, subject: str | None) -> str | None:
        """The person behind a recorded ``started_by`` (``key:<id>`` of a key made for
        one, or ``oidc:<sub>``); ``None`` for a service's key or the operator."""
        if subject is None:
            return None
        if subject.startswith("oidc:"):
            return subject[5:]
        if subject.startswith("key:"):
            async with translate_errors():
                person: str | None = await self._pool.fetchval(
                    "SELECT person FROM api_keys WHERE key_id = $1", subject[4:])
            return person
        return None

    async def open_reviews(self, tenant: str | None, agent: str | None, decision: str | None,
                           checks_failed: bool | None, limit: int,
                           case_id: uuid.UUID | None = None, overdue: bool | None = None
                           ) -> list[dict[str, Any]]:
        """Cases waiting for a person, oldest wait first, with what waits (the agent's
        answer and checks) and why."""
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""SELECT c.*, e.payload AS waiting, c.review_due_at < now() AS overdue
                    FROM cases c
                    LEFT JOIN LATERAL (
                        SELECT attempt, payload FROM event_log e
                        WHERE e.case_id = c.case_id AND e.event_type = '{PARKING_EVENT_TYPE}'
                        ORDER BY attempt DESC LIMIT 1) e ON true
                    WHERE c.status = '{CaseStatus.AWAITING_REVIEW.value}'
                      AND ($1::text IS NULL OR c.tenant_id = $1)
                      AND ($2::text IS NULL OR c.agent = $2)
                      AND ($3::text IS NULL OR c.decision = $3)
                      AND ($4::boolean IS NULL OR c.checks_failed = $4)
                      AND ($6::uuid IS NULL OR c.case_id = $6)
                      AND ($7::boolean IS NULL
                           OR coalesce(c.review_due_at < now(), false) = $7)
                      AND NOT EXISTS (SELECT 1 FROM case_actions a WHERE a.case_id = c.case_id
                                      AND a.parked_attempt >= e.attempt)
                    ORDER BY c.parked_at NULLS LAST, c.case_id LIMIT $5""",
                tenant, agent, decision, checks_failed, limit, case_id, overdue)
        return [dict(r) for r in rows]

    async def cancel_request(self, case_id: uuid.UUID) -> tuple[str | None, str | None] | None:
        """``(reason, by)`` when the case was asked to stop, else ``None``: a cancel
        broadcast is acted on only if this agrees."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                "SELECT cancel_reason, cancelled_by FROM cases WHERE case_id = $1 "
                "AND cancel_requested_at IS NOT NULL", case_id)
        return None if row is None else (row["cancel_reason"], row["cancelled_by"])

    async def request_cancel(
        self, case_id: uuid.UUID, reason: str | None, by: str | None = None
    ) -> Literal["requested", "ended", "unknown"]:
        async with translate_errors():
            row = await self._pool.fetchrow(
                f"""UPDATE cases SET cancel_requested_at = coalesce(cancel_requested_at, now()),
                          cancel_reason = coalesce(cancel_reason, $2),
                          cancelled_by = coalesce(cancelled_by, $3), updated_at = now()
                   WHERE case_id = $1
                     AND NOT terminal_published
                     AND status NOT IN ({_ENDED})
                   RETURNING case_id""",
                case_id, reason, by,
            )
            if row is not None:
                return "requested"
            exists = await self._pool.fetchval("SELECT 1 FROM cases WHERE case_id = $1", case_id)
        return "ended" if exists else "unknown"


@dataclass(frozen=True)
class SecretState:
    """What ``case_secrets`` says of a case: its sealed values, or who erased them."""

    placeholders: tuple[str, ...]
    sealed: SealedValues | None
    erased_at: datetime | None
    erased_by: str | None


class CaseSecrets:
    """A case's sensitive values: sealed on the way in, opened for ``pii:read`` callers
    (the worker gets them sealed with its claim), shredded on erase; every read in
    clear, export and erasure logged."""

    def __init__(self, pool: asyncpg.Pool, vault: Vault) -> None:
        self._pool = pool
        self.vault = vault

    async def state(self, case_id: uuid.UUID) -> SecretState | None:
        async with translate_errors():
            row = await self._pool.fetchrow(
                """SELECT master_key_id, wrapped_key, ciphertext, placeholders, erased_at,
                          erased_by FROM case_secrets WHERE case_id = $1""", case_id)
        if row is None:
            return None
        sealed = None if row["wrapped_key"] is None else SealedValues(
            row["master_key_id"], bytes(row["wrapped_key"]), bytes(row["ciphertext"]))
        return SecretState(tuple(row["placeholders"]), sealed, row["erased_at"],
                           row["erased_by"])

    async def erase(self, case_id: uuid.UUID, by: str
                    ) -> tuple[Literal["erased", "already", "nothing"], datetime | None]:
        """Destroy the data key and the ciphertext (crypto-shredding), recording who;
        the outcome and when the values were erased (now, or the first time)."""
        async with translate_errors():
            erased_at = await self._pool.fetchval(
                """UPDATE case_secrets SET wrapped_key = NULL, ciphertext = NULL,
                          erased_at = now(), erased_by = $2
                   WHERE case_id = $1 AND erased_at IS NULL RETURNING erased_at""",
                case_id, by)
            if erased_at is not None:
                # The digests of its sensitive business keys go too: nobody can test a
                # guess of an erased value against them any more.
                await self._pool.execute(
                    "DELETE FROM case_keys WHERE case_id = $1 AND digest", case_id)
                return "erased", erased_at
            row = await self._pool.fetchrow(
                "SELECT erased_at FROM case_secrets WHERE case_id = $1", case_id)
        return ("already", row["erased_at"]) if row is not None else ("nothing", None)

    async def log_access(self, principal: str, tenant: str, case_id: uuid.UUID,
                         action: Literal["pii:read", "export", "erase"]) -> None:
        async with translate_errors():
            await self._pool.execute(
                "INSERT INTO access_log (principal, tenant_id, case_id, action) "
                "VALUES ($1, $2, $3, $4)", principal, tenant, case_id, action)


class CapabilityKeyRegistry:
    """Each capability's X25519 public key (``capability_keys``), which tool requests seal
    their sensitive values to (service/sealing.py). Registered by ``setup`` on the
    bootstrap connection; the worker reads them."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def register(self, capability: str, public_key: bytes) -> None:
        """Record (or replace: a rotation) ``capability``'s key."""
        async with translate_errors():
            await self._pool.execute(
                """INSERT INTO capability_keys (capability, public_key) VALUES ($1, $2)
                   ON CONFLICT (capability) DO UPDATE SET public_key = EXCLUDED.public_key,
                       registered_at = now()
                   WHERE capability_keys.public_key <> EXCLUDED.public_key""",
                capability, public_key)

    async def all(self) -> dict[str, bytes]:
        async with translate_errors():
            rows = await self._pool.fetch("SELECT capability, public_key FROM capability_keys")
        return {r["capability"]: bytes(r["public_key"]) for r in rows}


class KeyRegistry:
    """The public keys events are signed with (``signing_keys``)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def register(self, key_id: str, public_key: bytes) -> PublicKey:
        """Record a worker's key (idempotent); the key as registered, retired or not.

        An operator's step (``casetrail signer register``, run by ``setup``), on the
        owner's or the bootstrap connection: no component's role may write
        ``signing_keys``, or whoever holds its password could vouch for a key of their
        own (docs/security.md)."""
        async with translate_errors():
            await self._pool.execute(
                """INSERT INTO signing_keys (key_id, public_key) VALUES ($1, $2)
                   ON CONFLICT (key_id) DO NOTHING""", key_id, public_key)
        registered = await self.registered(key_id, public_key)
        assert registered is not None
        return registered

    async def registered(self, key_id: str, public_key: bytes) -> PublicKey | None:
        """The key as registered (retired or not), ``None`` when it is not; a key id
        registered with another public key is a ``PermanentError``."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                "SELECT key_id, public_key, not_valid_after FROM signing_keys WHERE key_id = $1",
                key_id)
        if row is None:
            return None
        if bytes(row["public_key"]) != public_key:
            raise PermanentError(f"key id {key_id} is registered with another public key")
        return PublicKey(row["key_id"], bytes(row["public_key"]), row["not_valid_after"])

    async def all(self) -> list[PublicKey]:
        async with translate_errors():
            rows = await self._pool.fetch(
                "SELECT key_id, public_key, not_valid_after FROM signing_keys ORDER BY created_at")
        return [PublicKey(r["key_id"], bytes(r["public_key"]), r["not_valid_after"])
                for r in rows]

    async def describe(self) -> list[dict[str, Any]]:
        """Every key as ``GET /signing-keys`` shows it."""
        async with translate_errors():
            rows = await self._pool.fetch(
                """SELECT key_id, public_key, created_at, retired_at, not_valid_after
                   FROM signing_keys ORDER BY created_at""")
        return [{"keyId": r["key_id"], "publicKey": public_key_text(bytes(r["public_key"])),
                 "createdAt": utc_text(r["created_at"]), "retiredAt": utc_text(r["retired_at"]),
                 "notValidAfter": utc_text(r["not_valid_after"])} for r in rows]

    async def retire(self, key_id: str, not_valid_after: datetime | None = None
                     ) -> Literal["retired", "unknown"]:
        """From ``not_valid_after`` (default now) on, nothing this key signed verifies."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                """UPDATE signing_keys SET retired_at = coalesce(retired_at, now()),
                          not_valid_after = coalesce($2, now())
                   WHERE key_id = $1 RETURNING key_id""", key_id, not_valid_after)
        return "retired" if row is not None else "unknown"


def utc_text(value: datetime | None) -> str | None:
    """A stored time as the API writes it: ISO 8601 with ``Z``."""
    return None if value is None else value.isoformat().replace("+00:00", "Z")


async def principal_names(pool: asyncpg.Pool, subjects: Iterable[str | None]
                          ) -> dict[str, str]:
    """How people are shown a recorded principal (``startedBy``): a key made for a
    person as the person and the key's name (``rita (Rita's laptop)``), another key as
    its name, an OIDC subject as itself. Unknown or nameless keys are left out."""
    keys = {s[4:] for s in subjects if s and s.startswith("key:")}
    names = {s: s[5:] for s in subjects if s and s.startswith("oidc:")}
    if keys:
        async with translate_errors():
            rows = await pool.fetch("SELECT key_id, name, person FROM api_keys "
                                    "WHERE key_id = ANY($1::text[])", list(keys))
        for row in rows:
            shown = row["person"] or row["name"]
            if row["person"] and row["name"]:
                shown = f"{row['person']} ({row['name']})"
            if shown:
                names[f"key:{row['key_id']}"] = shown
    return names


class ApiKeyStore:
    """API keys (``api_keys``): created, listed, revoked, and found by id."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(self, tenant: str, scopes: Sequence[str], name: str | None = None,
                     expires_at: datetime | None = None, person: str | None = None
                     ) -> tuple[str, str]:
        """A new key for ``tenant`` (for ``person``, when one holds it); returns
        ``(key_id, key)``. The key is not kept."""
        key_id, key = new_key()
        async with translate_errors():
            await self._pool.execute(
                """INSERT INTO api_keys (key_id, key_hash, tenant_id, scopes, name, expires_at,
                                         person)
                   VALUES ($1, $2, $3, $4, $5, $6, $7)""",
                key_id, key_hash(key), tenant, list(scopes), name, expires_at, person)
        return key_id, key

    async def find(self, key_id: str) -> ApiKeyRecord | None:
        async with translate_errors():
            row = await self._pool.fetchrow(
                "SELECT * FROM api_keys WHERE key_id = $1", key_id)
        return None if row is None else _key_record(row)

    async def all(self) -> list[ApiKeyRecord]:
        async with translate_errors():
            rows = await self._pool.fetch("SELECT * FROM api_keys ORDER BY created_at")
        return [_key_record(r) for r in rows]

    async def revoke(self, key_id: str) -> bool:
        async with translate_errors():
            row = await self._pool.fetchrow(
                """UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
                   WHERE key_id = $1 RETURNING key_id""", key_id)
        return row is not None


def _key_record(row: asyncpg.Record) -> ApiKeyRecord:
    return ApiKeyRecord(row["key_id"], row["key_hash"], row["tenant_id"], tuple(row["scopes"]),
                        row["name"], row["created_at"], row["expires_at"], row["revoked_at"],
                        row["person"])


class TenantReaders:
    """Login roles for SQL users that see one tenant's rows (row-level security)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(self, role: str, tenant: str, password: str) -> None:
        """Create (or re-grant) ``role`` for ``tenant`` with ``password``, idempotently."""
        async with translate_errors(), self._pool.acquire() as conn, conn.transaction():
            exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role)
            verb = "ALTER" if exists else "CREATE"
            await conn.execute(await conn.fetchval(
                f"SELECT format('{verb} ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                "NOINHERIT PASSWORD %L', $1::text, $2::text)", role, password))
            grants = await conn.fetchval(
                "SELECT format('GRANT CONNECT ON DATABASE %I TO %I; "
                "GRANT USAGE ON SCHEMA public TO %I; "
                "GRANT SELECT ON event_log, cases, react_cycles, react_tool_calls, "
                "case_decisions, case_reviews TO %I', "
                "current_database(), $1::text, $1::text, $1::text)", role)
            await conn.execute(grants)
            await conn.execute(
                """INSERT INTO tenant_readers (role_name, tenant_id) VALUES ($1, $2)
                   ON CONFLICT (role_name) DO UPDATE SET tenant_id = excluded.tenant_id""",
                role, tenant)

    async def drop(self, role: str) -> None:
        async with translate_errors(), self._pool.acquire() as conn, conn.transaction():
            await conn.execute("DELETE FROM tenant_readers WHERE role_name = $1", role)
            if await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role):
                await conn.execute(await conn.fetchval(
                    "SELECT format('DROP OWNED BY %I; DROP ROLE %I', $1::text, $1::text)",
                    role))


async def tenant_counts(pool: asyncpg.Pool, tenant: str, max_active: int,
                        max_per_minute: int) -> tuple[int, int]:
    """``(cases queued or running, cases started in the last minute)`` of ``tenant``, each
    counted only up to its limit, so a check costs the same however busy a tenant is."""
    async with translate_errors():
        row = await pool.fetchrow(
            f"""SELECT
                 (SELECT count(*) FROM (SELECT 1 FROM cases WHERE tenant_id = $1
                    AND status IN ({_ACTIVE}) LIMIT $2) a) AS active,
                 (SELECT count(*) FROM (SELECT 1 FROM cases WHERE tenant_id = $1
                    AND created_at > now() - interval '1 minute' LIMIT $3) r) AS recent""",
            tenant, max_active, max_per_minute)
    assert row is not None
    return int(row["active"]), int(row["recent"])


async def rate_wait(pool: asyncpg.Pool, tenant: str, max_per_minute: int) -> int:
    """Seconds until the oldest of the tenant's last ``max_per_minute`` starts leaves the
    one-minute window (at least 1)."""
    async with translate_errors():
        wait = await pool.fetchval(
            """SELECT ceil(extract(epoch FROM min(created_at) + interval '1 minute' - now()))
               FROM (SELECT created_at FROM cases WHERE tenant_id = $1
                     AND created_at > now() - interval '1 minute'
                     ORDER BY created_at DESC LIMIT $2) w""", tenant, max_per_minute)
    return max(1, int(wait or 1))
