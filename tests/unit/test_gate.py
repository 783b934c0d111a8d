"""A rollout gate opens only on a backtest whose cases nobody picked and that holds
enough reviewed cases (casetrail.cases.gate.why_shut), read from its signed record."""

from __future__ import annotations

from typing import Any

import pytest

from casetrail.cases.gate import MIN_REVIEWED, why_shut


def _signed(listed: str | None = None, reviewed: int = 60, agreement: Any = 0.95
            ) -> dict[str, Any]:
    return {"selection": {"since": "2026-11-01T00:00:00+00:00", "casesListed": listed,
                          "picked": listed is not None},
            "summary": {"reviewed": reviewed,
                        "agreementWithReviewers": {"challenger": agreement}}}


def test_a_window_of_enough_reviewed_cases_that_agrees_opens() -> None:
    assert MIN_REVIEWED == 50
    assert why_shut(_signed(), 0.9, MIN_REVIEWED) is None


@pytest.mark.parametrize(("signed", "why"), [
    (_signed(listed="ab" * 32), "picked by who asked for it"),
    (_signed(reviewed=1), "1 reviewed cases, fewer than 50"),
    (_signed(agreement=0.89), "below 0.9"),
    (_signed(agreement=None), "below 0.9"),
    ({"summary": {"reviewed": 60}}, "does not say its selection"),
    ({**_signed(), "selection": {"casesListed": None, "picked": True}}, "picked"),
])
def test_a_picked_selection_too_few_reviewed_or_too_little_agreement_opens_nothing(
    signed: dict[str, Any], why: str,
) -> None:
    found = why_shut(signed, 0.9, MIN_REVIEWED)
    assert found is not None and why in found, found
