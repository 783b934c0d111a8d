"""Replay from the record: the demo's loan cases run again against their trails, with
the agent's code as it is, then with the lending policy's threshold changed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from casetrail.agents import AGENTS, loan_officer
from casetrail.audit.replay import recorded, replay_case, replay_many
from casetrail.config import Settings
from casetrail.engine.answers import Check, CheckContext
from tests.support.retention import decided_samples
from tests.support.stack import module_stack

stack = module_stack(worker_concurrency=4)


SINCE: list[datetime] = []
"""When the module's cases began (the CLI test replays only those)."""


@pytest.fixture(scope="module")
async def decided(stack: Any, auth_headers: dict[str, str], pool: asyncpg.Pool
                  ) -> dict[uuid.UUID, Any]:
    """The three sample applications, decided by the scripted loan officer: case id →
    its recorded events."""
    SINCE.append(datetime.now(UTC))
    trails = await decided_samples(stack.base_url, auth_headers, pool)
    assert [t[-1].event_type for t in trails.values()] == [
        "CASE_COMPLETED", "CASE_AWAITING_REVIEW", "CASE_COMPLETED"]
    return {case_id: recorded(trail) for case_id, trail in trails.items()}


async def test_an_unchanged_agent_replays_every_decision_the_same(
    decided: dict[uuid.UUID, Any], pool: asyncpg.Pool,
) -> None:
    stored = await pool.fetchval("SELECT count(*) FROM event_log")
    replays = await replay_many(decided)
    assert [r.outcome for r in replays] == ["same"] * 3, [r.as_json() for r in replays]
    assert [r.recorded_decision for r in replays] == ["approve", "refer", "decline"]
    assert all(r.replayed_decision == r.recorded_decision for r in replays)
    assert await pool.fetchval("SELECT count(*) FROM event_log") == stored  # nothing written


async def test_a_changed_policy_threshold_shows_which_decisions_change_and_where(
    decided: dict[uuid.UUID, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Maria Okafor's score is 742: auto-approved at 700, referred at 750. The others'
    decisions do not depend on that band."""
    monkeypatch.setattr(loan_officer, "AUTO_APPROVE_SCORE", 750)
    replays = {r.case_id: r for r in await replay_many(decided)}
    maria, daniel, priya = (replays[c] for c in decided)
    assert (maria.outcome, maria.recorded_decision, maria.replayed_decision) == (
        "diverged", "approve", "refer")
    assert maria.divergence is not None and maria.divergence.cycle == 2
    assert "lending-policy" in maria.divergence.recorded
    assert '"approve"' in maria.divergence.recorded and '"refer"' in maria.divergence.replayed
    # The others' policy reasons mention the band, so their cycles differ in text, but
    # their decisions stand.
    for other, decision in ((daniel, "refer"), (priya, "decline")):
        assert other.replayed_decision == other.recorded_decision == decision


async def test_a_new_check_shows_which_past_decisions_it_would_refuse(
    decided: dict[uuid.UUID, Any],
) -> None:
    """A stricter lending rule added as a check (no approve above 20,000): the replay
    names the past approve it would now refuse; the refer and the decline stand."""
    def within_limit(case: CheckContext) -> tuple[bool, str]:
        amount = case.input["loanAmount"]
        if case.answer["decision"] == "approve" and amount > 20_000:
            return False, f"approve of {amount:,} above the new limit of 20,000"
        return True, "within the limit"

    officer = AGENTS["loan-officer"]
    stricter = replace(officer, checks=(*officer.checks,
                                        Check("approve-limit", "1", within_limit)))
    replays = {r.case_id: r for r in await replay_many(decided, {"loan-officer": stricter})}
    maria, daniel, priya = (replays[c] for c in decided)
    assert (maria.outcome, maria.recorded_decision, maria.replayed_decision) == (
        "diverged", "approve", None)
    assert maria.refused_by == ("approve-limit 1",)
    assert maria.as_json()["refusedBy"] == ["approve-limit 1"]
    assert [(r.outcome, r.refused_by) for r in (daniel, priya)] == [("same", ())] * 2


async def test_a_case_with_recorded_model_turns_replays_without_asking_a_model(
    decided: dict[uuid.UUID, Any],
) -> None:
    """As a real provider's case: its turns are the recorded ones (here the scripted
    model's, taken from the record as if they were an OpenAI model's)."""
    case_id, events = next(iter(decided.items()))
    as_openai = [e if e.event_type != "CASE_STARTED" else type(e)(
        e.attempt, e.seq, e.event_type,
        {**e.payload, "model": {"provider": "openai", "name": "gpt-test"}}, e.occurred_at)
        for e in events]
    replay = await replay_case(case_id, as_openai)
    assert (replay.outcome, replay.replayed_decision) == ("same", "approve")


async def test_the_cli_replays_an_agents_cases_and_sums_them_up(
    decided: dict[uuid.UUID, Any], settings: Settings,
) -> None:
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "casetrail.cli", "replay", "--all", "--agent",
                         "loan-officer", "--since", SINCE[0].isoformat()],
        env=settings.environment(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 cases replayed: 3 same, 0 diverged" in done.stdout, done.stdout
    one = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "casetrail.cli", "replay",
                         str(next(iter(decided))), "--agent-version", "0.0.0-not-this"],
        env=settings.environment(), capture_output=True, text=True, timeout=60, check=False)
    assert one.returncode == 2 and "is not version 0.0.0-not-this" in one.stderr
