"""Claims of cases in Postgres, one at a time and many in one statement, and the
group-commit helper the worker sends them through."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import asyncpg
import pytest

from casetrail.adapters.store import CaseStore, NewCase
from casetrail.adapters.store.batching import Coalescer


async def new_case(store: CaseStore) -> uuid.UUID:
    case_id = uuid.uuid4()
    await store.insert_case(NewCase(case_id, "loan-officer", {}, {"provider": "scripted"}, {},
                                    "digest", None))
    return case_id


async def test_claim_many_decides_each_case_in_one_statement(pool: asyncpg.Pool) -> None:
    store = CaseStore(pool)
    fresh, ended, held, cancelled = [await new_case(store) for _ in range(4)]
    await store.claim(ended, "w1", 30)
    await store.mark_terminal_published(ended)
    await store.claim(held, "w1", 30)  # a live attempt elsewhere
    await store.request_cancel(cancelled, "withdrawn")
    nobody = uuid.uuid4()
    claims = await store.claim_many([fresh, ended, held, cancelled, nobody], "w2", 30)
    assert (claims[fresh].outcome, claims[fresh].attempt) == ("run", 1)
    assert claims[ended].outcome == "ended"
    assert claims[held].outcome == "busy"
    assert (claims[cancelled].outcome, claims[cancelled].cancel_reason) == (
        "cancel_queued", "withdrawn")
    assert claims[nobody].outcome == "unknown"
    # The claim was recorded: the same owner claiming again starts attempt 2.
    again = await store.claim(fresh, "w2", 30)
    assert (again.outcome, again.attempt) == ("run", 2)
    assert again.restart_reason is not None and "attempt 1" in again.restart_reason


async def test_mark_terminal_published_releases_every_case_given(pool: asyncpg.Pool) -> None:
    store = CaseStore(pool)
    cases = [await new_case(store) for _ in range(3)]
    claims = await store.claim_many(cases, "w1", 30)
    assert {c.outcome for c in claims.values()} == {"run"}
    await store.mark_terminal_published(*cases)
    rows = await pool.fetch("SELECT terminal_published, lease_owner FROM cases "
                            "WHERE case_id = ANY($1::uuid[])", cases)
    assert [tuple(r) for r in rows] == [(True, None)] * 3
    assert {c.outcome for c in (await store.claim_many(cases, "w2", 30)).values()} == {"ended"}


async def test_coalescer_answers_a_burst_in_few_batches() -> None:
    batches: list[list[int]] = []

    async def square(keys: Sequence[int]) -> dict[int, int]:
        batches.append(list(keys))
        await asyncio.sleep(0.01)
        return {k: k * k for k in keys}

    coalesce = Coalescer(square, max_batch=40)
    results = await asyncio.gather(*(coalesce(i) for i in range(100)))
    assert results == [i * i for i in range(100)]
    assert [len(b) for b in batches] == [40, 40, 20]
    assert await coalesce(7) == 49  # a lone request runs at once, alone
    assert batches[-1] == [7]


async def test_coalescer_gives_every_caller_of_a_failed_batch_the_error() -> None:
    async def broken(keys: Sequence[int]) -> dict[int, int]:
        raise RuntimeError("database unreachable")

    coalesce = Coalescer(broken)
    outcomes = await asyncio.gather(*(coalesce(i) for i in range(5)), return_exceptions=True)
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    with pytest.raises(RuntimeError):
        await coalesce(1)


async def test_coalescer_reports_a_key_the_batch_left_unanswered() -> None:
    async def partial(keys: Sequence[int]) -> dict[int, int]:
        return {k: k for k in keys if k % 2 == 0}

    coalesce = Coalescer(partial)
    outcomes = await asyncio.gather(coalesce(2), coalesce(3), return_exceptions=True)
    assert outcomes[0] == 2
    assert isinstance(outcomes[1], LookupError)


async def test_renew_leases_extends_only_the_owners_leases(pool: asyncpg.Pool) -> None:
    store = CaseStore(pool)
    mine, theirs = [await new_case(store) for _ in range(2)]
    await store.claim_many([mine], "w1", 1)
    await store.claim_many([theirs], "w2", 1)
    await store.renew_leases([theirs, mine], "w1", 60)
    left = {r["case_id"]: float(r["left"]) for r in await pool.fetch(
        "SELECT case_id, extract(epoch FROM lease_expires_at - now()) AS left FROM cases "
        "WHERE case_id = ANY($1::uuid[])", [mine, theirs])}
    assert left[mine] > 30
    assert left[theirs] <= 1
