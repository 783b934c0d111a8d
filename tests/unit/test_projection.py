"""A case's served values from its signed trail (casetrail.trail.projection): the rule
the owner's fold in migration 033 follows, as data."""

from __future__ import annotations

import re
from typing import Any

import pytest

from casetrail.contract.events import (
    PARKING_EVENT_TYPE,
    RUNNING_EVENT_TYPES,
    TERMINAL_EVENT_TYPES,
    status_for,
)
from casetrail.trail.projection import Projection, project
from tests.support import ROOT

CYCLE: tuple[str, dict[str, Any]] = (
    "REACT_CYCLE", {"cycleIndex": 1, "tokenUsage": {"inputTokens": 100, "outputTokens": 20}})
ANSWER = {"decision": "refer", "reasonCodes": ["INCOME_UNVERIFIED"]}


def test_a_case_without_events_is_queued() -> None:
    assert project([]) == Projection("queued", None, None, 0, 0, 0)


def test_a_case_at_work_shows_its_totals_and_no_answer_yet() -> None:
    got = project([("CASE_STARTED", {}), CYCLE, CYCLE])
    assert got == Projection("running", None, None, 2, 200, 40)


def test_a_waiting_case_shows_the_agents_answer_and_checks() -> None:
    parked = ("CASE_AWAITING_REVIEW", {"answer": ANSWER, "checks": [], "reviewReasons": ["x"]})
    got = project([("CASE_STARTED", {}), CYCLE, parked])
    assert got == Projection("awaiting_review", ANSWER, {"checks": [], "reviewReasons": ["x"]},
                             1, 100, 20)
    # Resumed after the review: at work again, the waiting answer no longer shown.
    assert project([("CASE_STARTED", {}), CYCLE, parked, ("CASE_REVIEWED", {})]).answer is None


def test_the_terminal_event_decides_and_administrative_events_move_nothing() -> None:
    completed = ("CASE_COMPLETED", {"answer": ANSWER, "decidedBy": "reviewer"})
    trail = [("CASE_STARTED", {}), CYCLE, completed, ("CASE_ERASED", {}),
             ("CASE_HELD", {"holdId": "h"})]
    assert project(trail) == Projection("completed", ANSWER, {"decidedBy": "reviewer"},
                                        1, 100, 20)
    failed = project([("CASE_STARTED", {}), ("CASE_FAILED", {"reasonCode": "max_cycles"})])
    assert (failed.status, failed.answer, failed.outcome) == (
        "failed", None, {"reasonCode": "max_cycles"})


@pytest.mark.parametrize("terminal", sorted(TERMINAL_EVENT_TYPES))
def test_every_terminal_type_gives_the_status_the_contract_names(terminal: str) -> None:
    status = status_for(terminal)
    assert status is not None
    assert project([(terminal, {})]).status == status.value


def test_the_owners_fold_names_the_same_event_types_as_the_contract() -> None:
    """The fold in migration 033 lists the types in SQL; the contract is the source."""
    fold = (ROOT / "migrations" / "033_served_values.sql").read_text()
    body = fold[fold.index("CREATE FUNCTION event_log_folds_into_cases"):]
    body = body[:body.index("$$;")]
    listed: dict[str, set[str]] = {"terminal": set(), "marks": set()}
    for group in re.findall(r"event_type IN \(([^)]*)\)", body):
        names = set(re.findall(r"'([A-Z_]+)'", group))
        listed["terminal" if "CASE_COMPLETED" in names else "marks"] |= names
    assert listed["terminal"] == set(TERMINAL_EVENT_TYPES)
    assert listed["marks"] == {*RUNNING_EVENT_TYPES, PARKING_EVENT_TYPE}


def test_differences_name_columns_never_values() -> None:
    shown = {"status": "completed", "answer": {"decision": "approve"}, "outcome": {},
             "cycles": 1, "input_tokens": 100, "output_tokens": 20}
    signed = Projection("completed", {"decision": "refer"}, {}, 1, 100, 20)
    assert signed.differences(shown) == ["answer"]
