"""A backtest's comparison: reviewers' final decisions are the labels, confirmations and
overrides alike; only reviewed cases count towards agreement."""

from __future__ import annotations

import uuid

from casetrail.audit.backtest import CaseOutcome, summary


def test_agreement_with_reviewers_counts_only_reviewed_cases() -> None:
    outcomes = [
        CaseOutcome(uuid.uuid4(), "refer", "approve", label="approve"),   # override: B right
        CaseOutcome(uuid.uuid4(), "refer", "refer", label="refer"),       # confirmed: both
        CaseOutcome(uuid.uuid4(), "approve", "decline"),                  # not reviewed
        CaseOutcome(uuid.uuid4(), "decline", None, problem="no answer"),  # not a change
    ]
    found = summary(outcomes)
    assert found["reviewed"] == 2
    assert found["agreementWithReviewers"] == {"champion": 0.5, "challenger": 1.0}
    assert found["changed"] == [str(outcomes[0].case_id), str(outcomes[2].case_id)]
    assert {"champion": "refer", "challenger": "approve", "cases": 1} in found["matrix"]


def test_no_reviewed_case_means_no_agreement_figure() -> None:
    found = summary([CaseOutcome(uuid.uuid4(), "approve", "approve")])
    assert found["agreementWithReviewers"] == {"champion": None, "challenger": None}
