"""What a case's row must show, from its signed trail (docs/design.md, "Served values").

``cases`` holds what people are shown of a case — its status, answer (the decision),
outcome (the checks, who decided, the reason) and cycle and token totals — folded from
the inserted events by the owner's trigger (migration 033), so no component's role
writes them. Whoever owns the database still can. Every read that shows a case's values
(``GET /cases/{id}``, the viewer, the report, ``verify``) recomputes them here from the
signed bytes it has just verified, by the fold's own rule, and compares: a value that
differs is a ``projection_mismatch``, and the case does not verify.

The rule, the same as the fold's: the totals count every ``REACT_CYCLE``; the first
terminal event ends the case (its status, its answer when it completed, the rest of its
payload as the outcome); otherwise the latest event that says where the case stands
(at work, or waiting for a person with the agent's answer and checks) decides; before
any, the case is queued. Administrative events move nothing. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from casetrail.contract.events import (
    PARKING_EVENT_TYPE,
    RUNNING_EVENT_TYPES,
    TERMINAL_EVENT_TYPES,
    CaseStatus,
    status_for,
)

_MARKS = frozenset((*RUNNING_EVENT_TYPES, PARKING_EVENT_TYPE))


@dataclass(frozen=True)
class Projection:
    """A case's served values, as its trail says them (named as ``cases``' columns)."""

    status: str
    answer: Any
    outcome: Any
    cycles: int
    input_tokens: int
    output_tokens: int

    def differences(self, row: Mapping[str, Any]) -> list[str]:
        """The columns of ``row`` that say something else (never their values: a
        message may be logged, and the answer may hold what only some may read)."""
        return [name for name, value in vars(self).items() if row.get(name) != value]


def project(events: Iterable[tuple[str, Mapping[str, Any]]]) -> Projection:
    """The values of a case whose events (type and payload, in ``(attempt, seq)`` order)
    are ``events``."""
    cycles = input_tokens = output_tokens = 0
    terminal: tuple[str, Mapping[str, Any]] | None = None
    mark: tuple[str, Mapping[str, Any]] | None = None
    for event_type, payload in events:
        if event_type == "REACT_CYCLE":
            usage = payload.get("tokenUsage") or {}
            cycles += 1
            input_tokens += int(usage.get("inputTokens") or 0)
            output_tokens += int(usage.get("outputTokens") or 0)
        if event_type in TERMINAL_EVENT_TYPES and terminal is None:
            terminal = (event_type, payload)
        elif event_type in _MARKS:
            mark = (event_type, payload)
    totals = (cycles, input_tokens, output_tokens)
    if terminal is not None:
        event_type, payload = terminal
        status = status_for(event_type)
        assert status is not None
        answer = payload.get("answer") if event_type == "CASE_COMPLETED" else None
        return Projection(status.value, answer, _without_answer(payload), *totals)
    if mark is None:
        return Projection(CaseStatus.QUEUED.value, None, None, *totals)
    event_type, payload = mark
    if event_type == PARKING_EVENT_TYPE:
        return Projection(CaseStatus.AWAITING_REVIEW.value, payload.get("answer"),
                          _without_answer(payload), *totals)
    return Projection(CaseStatus.RUNNING.value, None, None, *totals)


def _without_answer(payload: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k != "answer"}
