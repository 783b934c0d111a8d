"""The retention journal against the database (casetrail.adapters.bus.journal): which
entries the database lacks (the owner's ``journal_missing``, migration 026), and making
them again after a restore, as the operator."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

import asyncpg

from casetrail.adapters.store.pool import translate_errors


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


async def missing(pool: asyncpg.Pool, entries: Sequence[dict[str, Any]]) -> list[int]:
    """The positions of the entries the database does not hold."""
    if not entries:
        return []
    async with translate_errors():
        rows = await pool.fetch("SELECT journal_missing($1::jsonb) AS i", list(entries))
    return [r["i"] for r in rows]


async def make_again(pool: asyncpg.Pool, entry: dict[str, Any]) -> bool:
    """Make one missing entry again, as the operator; ``False`` when the database refuses
    it now (an erasure of a case a hold keeps: it is made once the hold ends)."""
    kind = entry["kind"]
    async with translate_errors():
        if kind == "policy":
            await pool.execute(
                "INSERT INTO retention_policies (tenant_id, agent, version, keep_days, "
                "counted_from, business_key, personal_data_days, preset, reason, set_by, "
                "set_at, action, archive) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, "
                "$11, $12, $13)",
                entry["tenantId"], entry["agent"], entry["version"], entry["keepDays"],
                entry["countedFrom"], entry["businessKey"], entry["personalDataDays"],
                entry["preset"], entry["reason"], entry["setBy"], _when(entry["setAt"]),
                entry.get("action"), bool(entry.get("archive", False)))
        elif kind == "approval":
            await pool.execute(
                "INSERT INTO retention_approvals (policy_id, approved_by, approved_at, "
                "action) SELECT policy_id, $4, $5, $6 FROM retention_policies WHERE "
                "tenant_id = $1 AND agent = $2 AND version = $3", entry["tenantId"],
                entry["agent"], entry["version"], entry["approvedBy"],
                _when(entry["approvedAt"]), entry.get("action"))
        elif kind == "businessDate":
            await pool.execute(
                "INSERT INTO retention_business_dates (tenant_id, field, value, ended_on, "
                "set_by, set_at) VALUES ($1, $2, $3, $4, $5, $6)", entry["tenantId"],
                entry["field"], entry["value"], date.fromisoformat(entry["endedOn"]),
                entry["setBy"], _when(entry["setAt"]))
        elif kind == "hold":
            await pool.execute(
                "INSERT INTO legal_holds (hold_id, tenant_id, scope, case_id, key_field, "
                "key_value, reason, ends_at, placed_by, placed_at, action) VALUES ($1, $2, "
                "$3, $4, $5, $6, $7, $8, $9, $10, $11)", uuid.UUID(entry["holdId"]),
                entry["tenantId"], entry["scope"],
                entry["caseId"] and uuid.UUID(entry["caseId"]), entry["keyField"],
                entry["keyValue"], entry["reason"], _when(entry["endsAt"]),
                entry["placedBy"], _when(entry["placedAt"]), entry.get("action"))
        elif kind == "release":
            await pool.execute(
                "INSERT INTO legal_hold_releases (hold_id, person, reason, released_at, "
                "action) VALUES ($1, $2, $3, $4, $5)", uuid.UUID(entry["holdId"]),
                entry["person"], entry["reason"], _when(entry["releasedAt"]),
                entry.get("action"))
        elif kind == "erasure":
            try:
                await pool.execute(
                    "SELECT erase_for_retention($1, $2)", uuid.UUID(entry["caseId"]),
                    entry["by"])
            except asyncpg.PostgresError:
                return False
        else:
            return False
    return True
