"""Schema changes that cannot slip: the database's allowed values are the contract's, and
the checked-in schema (migrations/schema/current.sql) is what the migrations make.

A new event type, status or wait kind added to the code without the migration that
lets the database store it fails here, not in production; a migration that changes the
schema without the file regenerated (scripts/current-schema --write) fails here too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any, get_args

import asyncpg

from casetrail.contract.events import (
    EVENT_TYPES,
    PARKING_EVENT_TYPE,
    RUNNING_EVENT_TYPES,
    TERMINAL_EVENT_TYPES,
    CaseExpiredPayload,
    CaseStatus,
    Verdict,
)
from casetrail.trail.person_actions import ActionKind, WaitKind
from tests.conftest import BASE_DB
from tests.support import ROOT

QUOTED = re.compile(r"'([^']*)'")


async def allowed(pool: asyncpg.Pool, table: str, constraint: str) -> list[str]:
    """The literals a CHECK constraint allows, in its order."""
    definition = await pool.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = $1::regclass AND conname = $2", table, constraint)
    assert definition, f"{table} has no constraint {constraint}"
    return QUOTED.findall(definition)


def values(literal: Any) -> list[str]:
    return list(get_args(literal))


async def test_the_databases_allowed_values_are_the_contracts(pool: asyncpg.Pool) -> None:
    assert await allowed(pool, "event_log", "event_log_event_type_check") == list(EVENT_TYPES)
    assert await allowed(pool, "cases", "cases_status_check") == list(CaseStatus)
    assert await allowed(pool, "cases", "cases_wait_kind_check") == values(WaitKind)
    assert await allowed(pool, "case_actions", "case_actions_kind_check") == values(ActionKind)
    assert await allowed(pool, "case_actions", "case_actions_verdict_check") == values(Verdict)
    counted_from = CaseExpiredPayload.model_fields["counted_from"].annotation
    assert await allowed(pool, "retention_policies",
                         "retention_policies_counted_from_check") == values(counted_from)


async def test_the_fold_knows_every_event_that_moves_a_case(pool: asyncpg.Pool) -> None:
    """The owner's fold (migration 033) names event types in its SQL: each is one the
    contract has, and every type that ends a case, parks it or shows it at work is there."""
    source = await pool.fetchval(
        "SELECT pg_get_functiondef('event_log_folds_into_cases'::regproc)")
    named = set(re.findall(r"'((?:CASE|REACT)_[A-Z_]+)'", source))
    assert named <= set(EVENT_TYPES), sorted(named - set(EVENT_TYPES))
    moving = {*TERMINAL_EVENT_TYPES, *RUNNING_EVENT_TYPES, PARKING_EVENT_TYPE}
    assert moving <= named, sorted(moving - named)


def test_the_checked_in_schema_is_the_one_the_migrations_make() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "current-schema"), "--check"],
        capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "CASETRAIL_DATABASE_URL": BASE_DB})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
