"""The case repository: cases, their claims and leases, their trail as stored, and
what the worker and the API note on the row."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from casetrail.adapters.store.pool import translate_errors
from casetrail.contract.events import (
    ACTIVE_SQL,
    ENDED_SQL,
    EVENT_TYPES,
    PARKING_EVENT_TYPE,
    CaseStatus,
)
from casetrail.contract.integrity import Integrity, IntegrityError
from casetrail.privacy.sensitive import SealedValues
from casetrail.trail.person_actions import PersonAction, SignedAction, WaitKind


def _claim_from_row(row: asyncpg.Record) -> Claim:
    outcome = row["outcome"]
    if outcome in ("ended", "busy", "parked"):
        return Claim(outcome)
    sealed = None if row["wrapped_key"] is None else SealedValues(
        row["master_key_id"], bytes(row["wrapped_key"]), bytes(row["ciphertext"]))
    recorded = RecordedCase(row["agent"], row["tenant_id"], row["input"], row["model"],
                            row["limits"], row["started_by"], sealed,
                            _signed_or_none(row["start_action"]), row["legacy_start"])
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
        row["decision"], row["reviewer"], row["acted_at"],
        None if row["action_signed"] is None else SignedAction(
            row["action_signed"], row["action_key_id"], row["action_sig"]))
    return Claim(
        "run", attempt=attempt, cancel_reason=row["cancel_reason"], restart_reason=restart,
        cancelled_by=row["cancelled_by"], case=recorded, action=action,
    )


def _signed_or_none(value: Any) -> SignedAction | None:
    """A stored signed action; ``None`` for none, or one that is not even well formed
    (the worker then refuses it as unsigned)."""
    if value is None:
        return None
    try:
        return SignedAction.from_json(value)
    except IntegrityError:
        return None


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
    start_action: dict[str, Any] | None = None
    """Its start as the API signed it (service/trail/person_actions.py)."""


ClaimOutcome = Literal["run", "ended", "busy", "cancel_queued", "parked", "unknown"]

# Claims of many cases, decided and recorded in one statement (one round trip,
# one implicit transaction; the row locks, taken in case-id order like the
# consumer's, are held while the decisions are made and written).
_CLAIM = f"""
WITH current AS MATERIALIZED (
    SELECT case_id, status, attempts_claimed, lease_owner, terminal_published,
           cancel_requested_at, cancel_reason, cancelled_by,
           agent, tenant_id, input, model, limits, started_by, parked_attempt, start_action,
           EXISTS (SELECT 1 FROM starts_before_signing s WHERE s.case_id = cases.case_id)
               AS legacy_start,
           lease_expires_at > now() AS lease_live
    FROM cases WHERE case_id = ANY($1::uuid[]) ORDER BY case_id FOR UPDATE
), decided AS (
    SELECT c.*, a.parked_attempt AS action_attempt, a.kind AS action_kind, a.verdict,
           a.reason AS action_reason, a.decision,
           a.reviewer, a.acted_at, a.signed AS action_signed, a.key_id AS action_key_id,
           a.sig AS action_sig, CASE
        -- The consumer folds a stored terminal event into the status in the statement
        -- that stores it, so the status alone says whether the log holds one (a look
        -- at the log here would be planned over every month's partition).
        WHEN c.terminal_published OR c.status IN ({ENDED_SQL}) THEN 'ended'
        WHEN c.lease_live AND c.lease_owner IS DISTINCT FROM $2 THEN 'busy'
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
    UPDATE cases SET attempts_claimed = d.attempts_claimed + 1, lease_owner = $2,
                     lease_expires_at = now() + make_interval(secs => $3)
    FROM decided d
    WHERE cases.case_id = d.case_id AND d.outcome IN ('run', 'cancel_queued')
    RETURNING cases.case_id, cases.attempts_claimed
)
SELECT d.case_id, d.outcome, d.cancel_reason, d.cancelled_by,
       d.agent, d.tenant_id, d.input, d.model, d.limits, d.started_by, d.start_action,
       d.legacy_start,
       d.lease_owner AS previous_owner, d.action_attempt, d.action_kind, d.verdict,
       d.action_reason, d.decision, d.reviewer, d.acted_at, d.action_signed,
       d.action_key_id, d.action_sig,
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
    start_action: SignedAction | None = None
    """Its start as the API signed it."""
    legacy_start: bool = False
    """Accepted before starts were signed (``starts_before_signing``): runs unsigned."""


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
    signed: SignedAction | None = None
    """What the API signed (``None``: a row no action key signed)."""


@dataclass(frozen=True)
class Wait:
    """What a parked attempt waits for, as the worker noted it beside ``parked_attempt``:
    a review, a second person's review of an override, or the answer to the model's
    question ``call_id``; and the persons who may not act on it."""

    attempt: int
    kind: WaitKind
    call_id: str | None = None
    excludes: tuple[str, ...] = ()
    acted: bool = False
    """Somebody already acted on this wait."""


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

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    async def ping(self) -> None:
        async with translate_errors():
            await self._pool.fetchval("SELECT 1")

    async def insert_case(self, case: NewCase) -> tuple[dict[str, Any], bool]:
        """Insert a queued case; with an idempotency key already used, return that case.

        Returns ``(row, created)``.
        """
        # One statement whatever the case carries (its keys, its sealed values): atomic
        # on its own, so no BEGIN and COMMIT round trips (17 % of the API's CPU).
        insert = """INSERT INTO cases (case_id, agent, input, model, limits, request_digest,
                                       idempotency_key, tenant_id, started_by, start_action)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                    ON CONFLICT (tenant_id, idempotency_key)
                        WHERE idempotency_key IS NOT NULL DO NOTHING
                    RETURNING *"""
        args: list[Any] = [case.case_id, case.agent, case.input, case.model, case.limits,
                           case.request_digest, case.idempotency_key, case.tenant_id,
                           case.started_by, case.start_action]
        also: list[str] = []
        if case.keys:
            n = len(args)
            also.append(f"""keyed AS (
                INSERT INTO case_keys (case_id, tenant_id, field, value, digest, created_at)
                SELECT i.case_id, i.tenant_id, k.field, k.value, k.digest, i.created_at
                FROM inserted i, unnest(${n + 1}::text[], ${n + 2}::text[], ${n + 3}::boolean[])
                                 AS k(field, value, digest))""")
            args += [[k[0] for k in case.keys], [k[1] for k in case.keys],
                     [k[2] for k in case.keys]]
        if case.sealed is not None:
            n = len(args)
            also.append(f"""sealed AS (
                INSERT INTO case_secrets (case_id, master_key_id, wrapped_key, ciphertext,
                                          placeholders)
                SELECT i.case_id, ${n + 1}, ${n + 2}, ${n + 3}, ${n + 4} FROM inserted i)""")
            args += [case.sealed.master_key_id, case.sealed.wrapped_key,
                     case.sealed.ciphertext, list(case.placeholders)]
        if also:
            insert = f"WITH inserted AS ({insert}), {', '.join(also)} SELECT * FROM inserted"
        async with translate_errors():
            row = await self._pool.fetchrow(insert, *args)
            if row is not None:
                return dict(row), True
            existing = await self._pool.fetchrow(
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
        async with translate_errors():  # the owner's function: the API may not delete
            return bool(await self._pool.fetchval("SELECT withdraw_case($1)", case_id))

    async def tombstone(self, case_id: uuid.UUID) -> dict[str, Any] | None:
        """What an expired case's CASE_EXPIRED said (its tombstone); ``None`` for a case
        that has not expired."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                "SELECT * FROM case_tombstones WHERE case_id = $1", case_id)
        return None if row is None else dict(row)

    async def get_case(self, case_id: uuid.UUID) -> dict[str, Any] | None:
        async with translate_errors():
            row = await self._pool.fetchrow("SELECT * FROM cases WHERE case_id = $1", case_id)
        return None if row is None else dict(row)

    async def case_and_trail(self, case_id: uuid.UUID
                             ) -> tuple[dict[str, Any] | None, list[StoredEvent]]:
        """The case's row and its whole trail with the signed bytes, as of one moment (one
        snapshot): the row shows exactly the events read beside it, so what it shows can
        be checked against them (docs/design.md, "Served values")."""
        async with translate_errors(), self._pool.acquire() as conn, conn.transaction(
                isolation="repeatable_read", readonly=True):
            row = await conn.fetchrow("SELECT * FROM cases WHERE case_id = $1", case_id)
            rows = await conn.fetch(
                f"""SELECT {_EVENT_COLUMNS}, body FROM event_log WHERE case_id = $1
                    ORDER BY attempt, seq""", case_id)
        return (None if row is None else dict(row)), [StoredEvent(**dict(r)) for r in rows]

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
                            limit: int, *, until: datetime | None = None,
                            among: Sequence[uuid.UUID] | None = None,
                            tenant: str | None = None) -> list[uuid.UUID]:
        """Cases the agent decided (completed, or waiting for a person to review its
        decision), oldest first: of ``agent`` (any when ``None``), created at or after
        ``since`` and before ``until``, among the ids ``among`` when given, of ``tenant``
        when given; at most ``limit``."""
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""SELECT case_id FROM cases
                   WHERE status IN ('{CaseStatus.COMPLETED.value}',
                                    '{CaseStatus.AWAITING_REVIEW.value}')
                     AND ($1::text IS NULL OR agent = $1)
                     AND ($2::timestamptz IS NULL OR created_at >= $2)
                     AND ($4::timestamptz IS NULL OR created_at < $4)
                     AND ($5::uuid[] IS NULL OR case_id = ANY($5::uuid[]))
                     AND ($6::text IS NULL OR tenant_id = $6)
                   ORDER BY created_at, case_id LIMIT $3""", agent, since, limit, until,
                None if among is None else list(among), tenant)
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
                _CLAIM, list(case_ids), owner, lease_seconds)
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
                      AND (status IN ({ACTIVE_SQL})
                           OR status = '{CaseStatus.AWAITING_REVIEW.value}')
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

    async def mark_parked(self, case_id: uuid.UUID, wait: Wait, due_at: datetime) -> None:
        """The worker's note that ``wait.attempt`` ended waiting for a person (its
        ``CASE_AWAITING_REVIEW`` confirmed), with what it waits for and whom it excludes:
        the case holds no lease while it waits, and its review is overdue from
        ``due_at``. Noting the same wait again keeps when it began."""
        async with translate_errors():
            await self._pool.execute(
                """UPDATE cases SET parked_at = CASE WHEN parked_attempt IS NOT DISTINCT
                                                     FROM $2 THEN parked_at ELSE now() END,
                                    parked_attempt = $2, review_due_at = $3,
                                    wait_kind = $4, wait_call_id = $5, wait_excludes = $6,
                                    lease_owner = NULL, lease_expires_at = NULL
                   WHERE case_id = $1""", case_id, wait.attempt, due_at, wait.kind,
                wait.call_id, list(wait.excludes))

    async def current_wait(self, case_id: uuid.UUID) -> Wait | None:
        """The wait the worker noted, when the case has not ended; ``None`` when it waits
        for nobody (or its wait is not noted yet)."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                f"""SELECT parked_attempt, wait_kind, wait_call_id, wait_excludes,
                           EXISTS (SELECT 1 FROM case_actions a WHERE a.case_id = c.case_id
                                   AND a.parked_attempt >= c.parked_attempt) AS acted
                    FROM cases c WHERE case_id = $1 AND NOT terminal_published
                      AND status NOT IN ({ENDED_SQL}) AND parked_attempt IS NOT NULL
                      AND wait_kind IS NOT NULL""", case_id)
        return None if row is None else Wait(row["parked_attempt"], row["wait_kind"],
                                             row["wait_call_id"], tuple(row["wait_excludes"]),
                                             row["acted"])

    async def refuse_action(self, case_id: uuid.UUID, parked_attempt: int, why: str,
                            code: str) -> bool:
        """Move the action kept for ``parked_attempt`` out of the wait's way into
        ``case_actions_refused`` (kept for the investigation), so the wait re-opens,
        through the owner's ``refuse_case_action`` (the worker deletes nothing);
        ``False`` when there was none."""
        async with translate_errors():
            return bool(await self._pool.fetchval(
                "SELECT refuse_case_action($1, $2, $3, $4)", case_id, parked_attempt,
                why[:2000], code))

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

    async def has_stored(self, case_id: uuid.UUID, attempt: int, event_type: str) -> bool:
        """Whether the log holds an event of ``event_type`` in the case's ``attempt``."""
        async with translate_errors():
            return bool(await self._pool.fetchval(
                "SELECT EXISTS (SELECT 1 FROM event_log WHERE case_id = $1 AND attempt = $2 "
                "AND event_type = $3)", case_id, attempt, event_type))

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

    async def record_action(self, action: PersonAction, signed: SignedAction,
                            reviewer: dict[str, Any] | None, decision: dict[str, Any] | None,
                            excluded: str | None
                            ) -> Literal["recorded", "taken", "moved", "not_parked"]:
        """Keep what a person did about the case's wait, with what the API signed, in one
        statement that checks it against the same parked attempt the API read: that
        attempt still waits, for this kind of action (and question), the person
        (``excluded``) is not one it excludes, and nobody acted on it yet. ``taken``
        when somebody did, ``moved`` when the wait is no longer the one read (or now
        excludes the person), ``not_parked`` when the case waits for nobody."""
        async with translate_errors():
            row = await self._pool.fetchrow(
                f"""WITH waiting AS (
                        SELECT case_id, parked_attempt, wait_kind, wait_call_id,
                               wait_excludes FROM cases
                        WHERE case_id = $1 AND NOT terminal_published
                          AND status NOT IN ({ENDED_SQL}) AND parked_attempt IS NOT NULL
                          AND wait_kind IS NOT NULL),
                    fits AS (
                        SELECT case_id, parked_attempt FROM waiting
                        WHERE parked_attempt = $2 AND wait_kind = $3
                          AND wait_call_id IS NOT DISTINCT FROM $4
                          AND ($5::text IS NULL OR NOT ($5::text = ANY(wait_excludes)))),
                    kept AS (
                        INSERT INTO case_actions (case_id, parked_attempt, kind, verdict,
                                                  reason, decision, reviewer, acted_at,
                                                  signed, key_id, sig)
                        SELECT case_id, parked_attempt, $6, $7, $8, $9, $10, $11, $12, $13,
                               $14 FROM fits
                        ON CONFLICT DO NOTHING RETURNING parked_attempt)
                    SELECT (SELECT count(*) FROM waiting) AS waiting,
                           (SELECT count(*) FROM fits) AS fits,
                           (SELECT count(*) FROM kept) AS kept""",
                action.case_id, action.wait, action.wait_kind, action.call_id, excluded,
                action.kind, action.verdict, action.reason, decision, reviewer,
                action.acted_at, signed.signed, signed.key_id, signed.sig)
        assert row is not None  # aggregates: always one row
        if not row["waiting"]:
            return "not_parked"
        if not row["fits"]:
            return "moved"
        return "recorded" if row["kept"] else "taken"

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
        one, or ``oidc:<sub>``), as four eyes compares persons: the person an operator
        linked its identity to, else its sub or the key's person id; ``None`` for a
        service's key or the operator."""
        if subject is None:
            return None
        if subject.startswith("oidc:"):
            return (await self.persons([("oidc", subject[5:])]))[0]
        if subject.startswith("key:"):
            async with translate_errors():
                person: str | None = await self._pool.fetchval(
                    """SELECT coalesce(p.person, k.person) FROM api_keys k
                       LEFT JOIN person_identities p ON p.identity = 'key:' || k.person
                       WHERE k.key_id = $1""", subject[4:])
            return person
        return None

    async def persons(self, identities: Sequence[tuple[str, str]]) -> list[str]:
        """Each ``(via, subject)`` identity (``oidc`` and a sub, ``key`` and a person id)
        as the person it belongs to: the one an operator linked it to, else ``subject``."""
        if not identities:
            return []
        names = [f"{via}:{subject}" for via, subject in identities]
        async with translate_errors():
            rows = await self._pool.fetch(
                "SELECT identity, person FROM person_identities WHERE identity = ANY($1)",
                names)
        linked = {r["identity"]: r["person"] for r in rows}
        return [linked.get(name, subject) for name, (_, subject) in zip(names, identities,
                                                                         strict=True)]

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
                     AND status NOT IN ({ENDED_SQL})
                   RETURNING case_id""",
                case_id, reason, by,
            )
            if row is not None:
                return "requested"
            exists = await self._pool.fetchval("SELECT 1 FROM cases WHERE case_id = $1", case_id)
        return "ended" if exists else "unknown"
