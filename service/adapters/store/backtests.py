"""Backtests as the database keeps them (migration 032): what was asked for and how far
it got (``backtests``), the per-case results and the signed record, which are never
changed (``backtest_results``, ``backtest_records``; the database chains the records
and puts each in the transparency log)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from casetrail.adapters.store.pool import translate_errors
from casetrail.contract.integrity import GENESIS, Integrity

_COLUMNS = ("backtest_id, tenant_id, agent, request, requested_by, requested_at, status, "
            "started_at, cases_done, cases_selected, problem, finished_at")


def _row(row: asyncpg.Record | None) -> dict[str, Any] | None:
    return None if row is None else dict(row)


class BacktestStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def ask(self, backtest_id: uuid.UUID, tenant: str | None, agent: str,
                  request: dict[str, Any], requested_by: str) -> dict[str, Any]:
        async with translate_errors():
            row = await self._pool.fetchrow(
                f"INSERT INTO backtests (backtest_id, tenant_id, agent, request, requested_by) "
                f"VALUES ($1, $2, $3, $4::jsonb, $5) RETURNING {_COLUMNS}",
                backtest_id, tenant, agent, request, requested_by)
        found = _row(row)
        assert found is not None
        return found

    async def get(self, backtest_id: uuid.UUID) -> dict[str, Any] | None:
        async with translate_errors():
            return _row(await self._pool.fetchrow(
                f"SELECT {_COLUMNS} FROM backtests WHERE backtest_id = $1", backtest_id))

    async def recent(self, tenant: str | None, limit: int) -> list[dict[str, Any]]:
        """The newest backtests of ``tenant`` (every one when ``None``)."""
        async with translate_errors():
            rows = await self._pool.fetch(
                f"SELECT {_COLUMNS} FROM backtests WHERE $1::text IS NULL OR tenant_id = $1 "
                "ORDER BY requested_at DESC LIMIT $2", tenant, limit)
        return [r for r in map(_row, rows) if r is not None]

    async def claim(self, owner: str, lease_seconds: float) -> dict[str, Any] | None:
        """The oldest backtest waiting (or whose runner's lease ran out), now ``owner``'s;
        a backtest run again starts over (nothing of a run is kept before its end)."""
        async with translate_errors():
            return _row(await self._pool.fetchrow(
                f"""UPDATE backtests SET status = 'running', runner = $1, cases_done = 0,
                       lease_expires_at = now() + make_interval(secs => $2),
                       started_at = now()
                    WHERE backtest_id = (
                        SELECT backtest_id FROM backtests
                        WHERE status = 'queued' OR (status = 'running'
                                                     AND lease_expires_at < now())
                        ORDER BY requested_at LIMIT 1 FOR UPDATE SKIP LOCKED)
                    RETURNING {_COLUMNS}""", owner, lease_seconds))

    async def progress(self, backtest_id: uuid.UUID, owner: str, done: int, selected: int,
                       lease_seconds: float) -> bool:
        """Note how far the run got and hold the lease; ``False`` once it is not
        ``owner``'s any more."""
        async with translate_errors():
            status = await self._pool.execute(
                "UPDATE backtests SET cases_done = $3, cases_selected = $4, "
                "lease_expires_at = now() + make_interval(secs => $5) "
                "WHERE backtest_id = $1 AND runner = $2 AND status = 'running'",
                backtest_id, owner, done, selected, lease_seconds)
        return status != "UPDATE 0"

    async def fail(self, backtest_id: uuid.UUID, owner: str, problem: str) -> None:
        async with translate_errors():
            await self._pool.execute(
                "UPDATE backtests SET status = 'failed', problem = $3, finished_at = now(), "
                "lease_expires_at = NULL WHERE backtest_id = $1 AND runner = $2",
                backtest_id, owner, problem)

    async def keep(self, backtest_id: uuid.UUID, owner: str,
                   results: Sequence[tuple[uuid.UUID, dict[str, Any], str]],
                   seal: Callable[[str], tuple[bytes, Integrity]]) -> Integrity | None:
        """Keep the results (case id, result, digest) and the record ``seal(prev_hash)``
        signs, chained after the last record, in one transaction; ``None`` when the run
        is no longer ``owner``'s (another runner took it over)."""
        async with translate_errors(), self._pool.acquire() as conn, conn.transaction():
            mine = await conn.fetchval(
                "SELECT true FROM backtests WHERE backtest_id = $1 AND runner = $2 "
                "AND status = 'running' FOR UPDATE", backtest_id, owner)
            if not mine:
                return None
            await conn.execute(
                "INSERT INTO backtest_results (backtest_id, position, case_id, result, digest) "
                "SELECT $1, * FROM unnest($2::int[], $3::uuid[], $4::jsonb[], $5::text[])",
                backtest_id, list(range(len(results))), [r[0] for r in results],
                [r[1] for r in results], [r[2] for r in results])
            await conn.execute(  # the lock the database's chain check takes
                "SELECT pg_advisory_xact_lock(hashtext('casetrail.backtest_records'))")
            last = await conn.fetchrow(
                "SELECT chain_seq, hash FROM backtest_records ORDER BY chain_seq DESC LIMIT 1")
            body, integrity = seal(last["hash"] if last else GENESIS)
            await conn.execute(
                "INSERT INTO backtest_records (backtest_id, chain_seq, body, prev_hash, hash, "
                "key_id, sig) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                backtest_id, last["chain_seq"] + 1 if last else 0, body, integrity.prev_hash,
                integrity.hash, integrity.key_id, integrity.sig)
            await conn.execute(
                "UPDATE backtests SET status = 'done', cases_done = $2, finished_at = now(), "
                "lease_expires_at = NULL WHERE backtest_id = $1", backtest_id, len(results))
        return integrity

    async def passing(self, agent_digest: str, threshold: float, tenant: str,
                      limit: int = 20) -> list[dict[str, Any]]:
        """The newest records (the operator's backtests, or ``tenant``'s) that name
        ``agent_digest`` as the challenger and an agreement with the reviewers of at least
        ``threshold``: as stored, to be checked against their signatures before use."""
        async with translate_errors():
            rows = await self._pool.fetch(
                """SELECT r.backtest_id, r.body, r.prev_hash, r.hash, r.key_id, r.sig,
                          r.recorded_at
                   FROM backtest_records r JOIN backtests b USING (backtest_id),
                        LATERAL (SELECT convert_from(r.body, 'UTF8')::jsonb AS signed) s
                   WHERE (b.tenant_id IS NULL OR b.tenant_id = $3)
                     AND s.signed #>> '{challenger,agentDigest}' = $1
                     AND (s.signed #>> '{summary,agreementWithReviewers,challenger}')::float8
                         >= $2
                   ORDER BY r.chain_seq DESC LIMIT $4""",
                agent_digest, threshold, tenant, limit)
        return [dict(r) for r in rows]

    async def record(self, backtest_id: uuid.UUID) -> dict[str, Any] | None:
        async with translate_errors():
            row = await self._pool.fetchrow(
                "SELECT backtest_id, chain_seq, body, prev_hash, hash, key_id, sig, recorded_at "
                "FROM backtest_records WHERE backtest_id = $1", backtest_id)
        return None if row is None else dict(row)

    async def results(self, backtest_id: uuid.UUID) -> list[dict[str, Any]]:
        async with translate_errors():
            rows = await self._pool.fetch(
                "SELECT result FROM backtest_results WHERE backtest_id = $1 ORDER BY position",
                backtest_id)
        return [r["result"] for r in rows]
