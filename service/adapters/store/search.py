"""Case search (``GET /cases``): one tenant's cases, filtered, newest first, in pages.

Pages are keyed, not numbered: the cursor is the ``(created_at, case_id)`` of the last
case on the page, so the next page is an index range scan that starts where this one
stopped (``OFFSET`` would read and throw away every earlier page), and a case started
while a reviewer pages is never shown twice or skipped. Callers pass the cursor back
as they got it (``<microseconds since 1970>-<case id hex>``); every string of that form
is a valid place to start. migrations/008_case_search.sql has the indexes each filter
uses.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from casetrail.adapters.store import principal_names, translate_errors, utc_text
from casetrail.adapters.store.evidence_views import business_keys
from casetrail.contract.events import CaseStatus

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

CURSOR_PATTERN = r"^[0-9]{1,16}-[0-9a-f]{32}$"
"""Every cursor (16 digits of microseconds reach the year 2286)."""


class BadCursor(ValueError):
    """A cursor this server did not hand out (or one damaged on the way)."""


@dataclass(frozen=True)
class Cursor:
    """Where the next page starts: after this case, in newest-first order."""

    created_at: datetime
    case_id: uuid.UUID

    def encode(self) -> str:
        micros = (self.created_at - _EPOCH) // timedelta(microseconds=1)
        return f"{micros}-{self.case_id.hex}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        if not re.match(CURSOR_PATTERN, text):
            raise BadCursor("not a cursor: pass back a nextCursor as it was given")
        micros, _, case = text.partition("-")
        return cls(_EPOCH + timedelta(microseconds=int(micros)), uuid.UUID(hex=case))


@dataclass(frozen=True)
class CaseFilter:
    """What a search asks for; ``None`` leaves a field unfiltered."""

    tenant: str
    agent: str | None = None
    status: str | None = None
    decision: str | None = None
    since: datetime | None = None
    """Cases created at or after this instant."""
    until: datetime | None = None
    """Cases created before this instant."""
    checks_failed: bool | None = None
    """True: only cases where one of the agent's checks failed."""
    keys: tuple[tuple[str | None, tuple[str, ...]], ...] = ()
    """Business keys the case must have: ``(field or any, the values or digests that
    match)`` each."""

    @property
    def matches_nothing(self) -> bool:
        """Only a completed case has an answer, so a decision with another status
        finds nothing (answered here rather than by scanning every such decision)."""
        return self.decision is not None and self.status not in (None, CaseStatus.COMPLETED)

    def where(self, after: Cursor | None) -> tuple[str, list[Any]]:
        """The ``WHERE`` clause and its arguments."""
        clauses, args = ["tenant_id = $1"], [self.tenant]

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        if self.agent is not None:
            clauses.append(f"agent = {arg(self.agent)}")
        if self.status is not None:
            clauses.append(f"status = {arg(self.status)}")
        if self.decision is not None:
            clauses.append(f"decision = {arg(self.decision)}")
        if self.checks_failed:
            clauses.append("checks_failed")
        for field, values in self.keys:
            by_field = "" if field is None else f" AND field = {arg(field)}"
            clauses.append(f"case_id IN (SELECT case_id FROM case_keys WHERE tenant_id = $1 "
                           f"AND value = ANY({arg(list(values))}::text[]){by_field})")
        if self.since is not None:
            clauses.append(f"created_at >= {arg(self.since)}")
        if self.until is not None:
            clauses.append(f"created_at < {arg(self.until)}")
        if after is not None:
            clauses.append(f"(created_at, case_id) < ({arg(after.created_at)}, "
                           f"{arg(after.case_id)})")
        return " AND ".join(clauses), args


def case_summary(row: Any) -> dict[str, Any]:
    """What a case's list item and its full view share, from its ``cases`` row."""
    return {
        "caseId": str(row["case_id"]),
        "agent": row["agent"],
        "status": row["status"],
        "attempts": row["attempts_claimed"],
        "cycles": row["cycles"],
        "tokenUsage": {"inputTokens": row["input_tokens"],
                       "outputTokens": row["output_tokens"]},
        "createdAt": utc_text(row["created_at"]),
        "endedAt": utc_text(row["ended_at"]),
    }


def _item(row: asyncpg.Record) -> dict[str, Any]:
    return case_summary(row) | {"decision": row["decision"], "startedBy": row["started_by"]}


class CaseIndex:
    """The search query, on the API's pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def search(self, wanted: CaseFilter, limit: int, after: Cursor | None = None
                     ) -> tuple[list[dict[str, Any]], Cursor | None]:
        """A page of at most ``limit`` cases, and the cursor of the next page (``None``
        on the last one)."""
        if wanted.matches_nothing:
            return [], None
        where, args = wanted.where(after)
        args.append(limit + 1)  # one more than asked: is there a next page?
        async with translate_errors():
            rows = await self._pool.fetch(
                f"""SELECT case_id, agent, status, decision,
                           attempts_claimed, cycles, input_tokens, output_tokens,
                           started_by, created_at, ended_at
                    FROM cases WHERE {where}
                    ORDER BY created_at DESC, case_id DESC
                    LIMIT ${len(args)}""", *args)
        more = len(rows) > limit
        rows = rows[:limit]
        following = Cursor(rows[-1]["created_at"], rows[-1]["case_id"]) if more else None
        names = await principal_names(self._pool, (row["started_by"] for row in rows))
        keys = await business_keys(self._pool, [row["case_id"] for row in rows])
        return [_item(row) | {"startedByName": names.get(row["started_by"]),
                              "keys": keys.get(row["case_id"], {})}
                for row in rows], following
