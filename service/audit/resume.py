"""Taking up a case from its record: the conversation its recorded cycles held.

When a worker dies mid-case, the next attempt does not start over. Its worker reads
the events of the earlier attempts that reached Postgres, checks their chains and
signatures, and rebuilds the conversation from the recorded cycles: each
``REACT_CYCLE`` holds the model's turn (its text and tool calls) and every call's
result or error, which is what the model saw next. Those turns are not asked again
and those tools are not run again; the attempt continues at the next cycle index
(``CASE_STARTED.resumedFrom``). A cycle cut short (no ``REACT_CYCLE`` stored) runs
again; its worker tool calls keep their idempotency keys (case, cycle index, call
index), so a capability worker that had answered answers from memory.

An attempt that resumed another carries that one's cycles too: the chain is followed
back through each ``resumedFrom``.

A case that waited for a person is taken up the same way: the attempt that ended with
``CASE_AWAITING_REVIEW`` is resumed, the review recorded in ``CASE_REVIEWED`` (a
returned case's note becomes part of the conversation, as the model was told it).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from casetrail.audit.evidence import trail_events
from casetrail.contract.events import (
    PARKING_EVENT_TYPE,
    ZERO_USAGE,
    CaseReviewedPayload,
    CheckResult,
    PendingQuestion,
    ResumedFrom,
    TokenUsage,
)
from casetrail.engine.answers import returned_note
from casetrail.engine.case import Parked, Resumption
from casetrail.engine.chat import ChatMessage
from casetrail.engine.recorded import cycle_messages
from casetrail.privacy.sensitive import restore
from casetrail.trail.verification import verify_trail

if TYPE_CHECKING:
    from casetrail.adapters.store import CaseStore, KeyRegistry

log = logging.getLogger("casetrail.worker")


@dataclass(frozen=True)
class RecordedEvent:
    """What resuming reads of a stored event."""

    attempt: int
    seq: int
    event_type: str
    payload: Mapping[str, Any]
    occurred_at: datetime


_CARRIED = frozenset({"REACT_CYCLE", PARKING_EVENT_TYPE, "CASE_REVIEWED"})
"""What an attempt carries over of the ones it resumed: the cycles, and the waits for a
person and their reviews between them."""


def _steps(by_attempt: Mapping[int, list[RecordedEvent]], attempt: int) -> list[RecordedEvent]:
    """The recorded steps attempt ``attempt`` stands on (those it resumed, then its own):
    cycles, waits for review and reviews, in order."""
    events = by_attempt.get(attempt, [])
    if not events or events[0].event_type != "CASE_STARTED":
        return []
    carried: list[RecordedEvent] = []
    resumed = events[0].payload.get("resumedFrom")
    if isinstance(resumed, Mapping):
        cycles = int(resumed["cycles"])
        for step in _steps(by_attempt, int(resumed["attempt"])):
            if step.event_type == "REACT_CYCLE":
                if cycles == 0:
                    break
                cycles -= 1
            carried.append(step)
    return carried + [e for e in events if e.event_type in _CARRIED]


def _chain(by_attempt: Mapping[int, list[RecordedEvent]], attempt: int
           ) -> list[Mapping[str, Any]]:
    """The cycles attempt ``attempt`` stands on: those it resumed, then its own."""
    return [s.payload for s in _steps(by_attempt, attempt) if s.event_type == "REACT_CYCLE"]


def waited_for_people(events: Iterable[RecordedEvent], now: datetime) -> timedelta:
    """How long the case has waited for people: from each ``CASE_AWAITING_REVIEW`` to the
    start of the next attempt (or ``now``). A case's deadline does not count it."""
    ordered = sorted(events, key=lambda e: (e.attempt, e.seq))
    waited = timedelta(0)
    for index, event in enumerate(ordered):
        if event.event_type != PARKING_EVENT_TYPE:
            continue
        resumed = next((e.occurred_at for e in ordered[index + 1:]
                        if e.event_type == "CASE_STARTED"), now)
        waited += max(resumed - event.occurred_at, timedelta(0))
    return waited


def first_start(events: Iterable[RecordedEvent]) -> datetime | None:
    """When the case's first recorded attempt started (its deadline counts from there)."""
    starts = [e.occurred_at for e in events if e.event_type == "CASE_STARTED"]
    return min(starts) if starts else None


def _latest(events: Sequence[RecordedEvent]
            ) -> tuple[int, dict[int, list[RecordedEvent]]] | None:
    """The last attempt whose start reached the record, and the events by attempt."""
    by_attempt: dict[int, list[RecordedEvent]] = {}
    for event in sorted(events, key=lambda e: (e.attempt, e.seq)):
        by_attempt.setdefault(event.attempt, []).append(event)
    for attempt in sorted(by_attempt, reverse=True):
        if by_attempt[attempt][0].event_type == "CASE_STARTED":
            return attempt, by_attempt
    return None


def final_chain(events: Sequence[RecordedEvent]) -> list[Mapping[str, Any]]:
    """The recorded cycles of the case as its last recorded attempt had them (the
    cycles it resumed, then its own), in cycle order."""
    latest = _latest(events)
    return [] if latest is None else _chain(latest[1], latest[0])


def resumption(events: Sequence[RecordedEvent], values: Mapping[str, str]
               ) -> Resumption | None:
    """What the next attempt takes over from ``events`` (the earlier attempts' stored
    events); ``None`` when no attempt got as far as a recorded cycle. ``values``
    restores the case's sensitive values in the recorded payloads."""
    latest = _latest(events)
    if latest is None:
        return None
    attempt, by_attempt = latest
    steps = _steps(by_attempt, attempt)
    cycles = [restore(dict(s.payload), values) if values else s.payload for s in steps
              if s.event_type == "REACT_CYCLE"]
    opened = iter(cycles)  # each cycle's values restored once
    if not cycles and not any(s.event_type == PARKING_EVENT_TYPE for s in steps):
        return None
    usage = ZERO_USAGE
    messages: list[ChatMessage] = []
    parked: Parked | None = None
    returns = 0
    reviewers: list[tuple[str, str]] = []
    answer: Any = None
    for step in steps:
        if step.event_type == "REACT_CYCLE":
            cycle = next(opened)
            usage = usage + TokenUsage.model_validate(cycle["tokenUsage"])
            messages.extend(cycle_messages(cycle))
            parked, answer = None, cycle.get("answer")
        elif step.event_type == PARKING_EVENT_TYPE:
            waiting = restore(dict(step.payload), values) if values else step.payload
            asked = waiting.get("question")
            parked = Parked(
                step.attempt, waiting.get("answer"),
                tuple(CheckResult.model_validate(c) for c in waiting.get("checks") or ()),
                question=None if asked is None else PendingQuestion.model_validate(asked),
                asked_at=step.occurred_at, reasons=tuple(waiting.get("reviewReasons") or ()))
        elif parked is not None:  # its review
            review = CaseReviewedPayload.model_validate(
                restore(dict(step.payload), values) if values else step.payload)
            parked = dataclasses.replace(parked, review=review)
            reviewers.append((review.reviewer.via, review.reviewer.subject))
            if review.verdict == "return":  # the model answers again
                returns += 1
                messages.append(returned_note(messages, review.reason))
                parked, answer = None, None
    return Resumption(
        resumed_from=ResumedFrom(attempt=attempt, seq=by_attempt[attempt][-1].seq,
                                 cycles=len(cycles)),
        messages=tuple(messages), cycles=len(cycles), usage=usage,
        tool_calls=tuple(call for cycle in cycles for call in cycle.get("toolCalls") or ()),
        rejections=sum(1 for cycle in cycles if cycle.get("answerRejected")),
        answer=answer if isinstance(answer, dict) else None,
        parked=parked, returns=returns, reviewers=tuple(reviewers))


async def record_so_far(store: CaseStore, keys: KeyRegistry, case_id: uuid.UUID, attempt: int,
                        values: dict[str, str], deadline_seconds: float
                        ) -> tuple[Resumption | None, datetime | None]:
    """What the earlier attempts left in the record: the cycles to resume from (when
    their chains and signatures verify), and when the case's deadline passes (from the
    first attempt's start, not counting the time it waited for people)."""
    stored = [e for e in await store.find_by_case_and_types(case_id, with_body=True)
              if e.attempt < attempt]
    recorded = [RecordedEvent(e.attempt, e.seq, e.event_type, e.payload, e.occurred_at)
                for e in stored]
    report = verify_trail(str(case_id), trail_events(stored),
                          {k.key_id: k for k in await keys.all()})
    started = first_start(recorded)
    deadline_at = None if started is None else started + timedelta(
        seconds=deadline_seconds) + waited_for_people(recorded, datetime.now(UTC))
    if not report.verified:
        log.error("case %s: the record of earlier attempts does not verify (%s); "
                  "attempt %d starts from the beginning", case_id,
                  report.first_problem(), attempt)
        return None, deadline_at
    found = resumption(recorded, values)
    if found is not None:
        log.info("case %s attempt %d resumes from attempt %d after %d recorded cycles",
                 case_id, attempt, found.resumed_from.attempt, found.cycles)
    return found, deadline_at
