"""The loss/duplication checker.

A *witness* quorum queue bound to every event (``case.#``) receives each event the
broker accepted, exactly as the event-log queue does; the checker compares it,
event by event, with what Postgres holds:

- published: distinct event ids the broker accepted (the witness);
- persisted once: of those, stored exactly once in ``event_log``;
- lost: accepted but not stored;
- duplicated: the same (case, attempt, seq) or the same event stored twice, or a
  case with more than one terminal event;
- unexpected: stored but never accepted by the broker;
- repeated model turns: a cycle recorded by more than one attempt of a case (a
  resumed attempt asks again only the turn of a cycle the record does not hold);
- repeated worker tool calls: tool handler runs on the capability worker beyond one
  per worker call in the cases' records (measured where the capability worker lives
  through the fault: its metrics count the runs);
- not in the log: stored events that are not a leaf of the transparency log's latest
  signed checkpoint once the ledger has caught up (an event is a leaf at most once:
  a unique index).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import asyncpg
import orjson

from casetrail.adapters.bus.topology import Topology
from casetrail.contract.events import PARKING_EVENT_TYPE, TERMINAL_EVENT_TYPES


def witness_name(topology: Topology) -> str:
    return f"{topology.namespace}.witness"


async def declare_witness(connection: aio_pika.abc.AbstractRobustConnection,
                          topology: Topology) -> None:
    channel = await connection.channel()
    exchange = await topology.declare_events_exchange(channel)
    queue = await channel.declare_queue(witness_name(topology), durable=True,
                                        arguments={"x-queue-type": "quorum"})
    await queue.bind(exchange, routing_key="case.#")
    await channel.close()


async def drain_witness(connection: aio_pika.abc.AbstractRobustConnection,
                        topology: Topology) -> list[dict[str, Any]]:
    channel = await connection.channel()
    queue = await channel.get_queue(witness_name(topology), ensure=False)
    seen: list[dict[str, Any]] = []
    idle = 0
    while idle < 10:
        message = await queue.get(no_ack=True, fail=False)
        if message is None:
            idle += 1
            await asyncio.sleep(0.05)
            continue
        idle = 0
        try:
            seen.append(orjson.loads(message.body))
        except orjson.JSONDecodeError:
            continue  # poison is the dead-letter check's business
    await channel.queue_delete(witness_name(topology), if_unused=False, if_empty=False)
    await channel.close()
    return seen


@dataclass
class Report:
    fault: str
    accepted: int
    terminal_once: int
    published: int
    persisted_once: int
    lost: int
    duplicated: int
    unexpected: int
    seq_gaps: int
    repeated_turns: int = 0
    repeated_tool_calls: int | None = None
    """``None``: not measured (the capability worker itself was killed)."""
    not_logged: int = 0
    parked: int = 0
    """Accepted cases waiting for a person: their trail ends, for now, in one
    CASE_AWAITING_REVIEW (accounted for, like a terminal event)."""
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return (self.lost == 0 and self.duplicated == 0 and self.unexpected == 0
                and self.seq_gaps == 0 and self.terminal_once + self.parked == self.accepted
                and self.repeated_turns == 0 and not self.repeated_tool_calls
                and self.not_logged == 0)


async def check(fault: str, pool: asyncpg.Pool, witness: list[dict[str, Any]],
                accepted: set[uuid.UUID], case_ids: set[uuid.UUID] | None = None,
                tool_runs: int | None = None) -> Report:
    """Compare the witness with ``event_log`` for the cases in question; ``tool_runs``:
    how many times the capability worker ran a tool handler, when it was measured."""
    valid = [w for w in witness if isinstance(w, dict) and "eventId" in w and "caseId" in w]
    scope = case_ids if case_ids is not None else {uuid.UUID(w["caseId"]) for w in valid}
    scope |= accepted
    published = {uuid.UUID(w["eventId"]) for w in valid if uuid.UUID(w["caseId"]) in scope}
    rows = await pool.fetch(
        "SELECT event_id, case_id, attempt, seq, event_type, "
        "(payload->>'cycleIndex')::int AS cycle_index, "
        "(SELECT count(*) FROM jsonb_array_elements(payload->'toolCalls') c "
        " WHERE c->>'toolSource' = 'worker') AS worker_calls "
        "FROM event_log WHERE case_id = ANY($1::uuid[])", list(scope))
    stored = Counter(r["event_id"] for r in rows)
    positions = Counter((r["case_id"], r["attempt"], r["seq"]) for r in rows)
    terminals = Counter(r["case_id"] for r in rows if r["event_type"] in TERMINAL_EVENT_TYPES)
    last: dict[uuid.UUID, tuple[int, int, str]] = {}
    for r in rows:
        if (r["attempt"], r["seq"]) > last.get(r["case_id"], (0, -1, ""))[:2]:
            last[r["case_id"]] = (r["attempt"], r["seq"], r["event_type"])
    parked = sum(1 for c in accepted if c not in terminals
                 and last.get(c, (0, 0, ""))[2] == PARKING_EVENT_TYPE)
    seqs: dict[tuple[uuid.UUID, int], list[int]] = {}
    for r in rows:
        seqs.setdefault((r["case_id"], r["attempt"]), []).append(r["seq"])
    gaps = sum(sorted(v) != list(range(len(v))) for v in seqs.values())
    # Over the cases a worker ran (accepted through the API), not events a scenario
    # published by hand.
    ran = [r for r in rows if r["event_type"] == "REACT_CYCLE" and r["case_id"] in accepted]
    cycles = Counter((r["case_id"], r["cycle_index"]) for r in ran)
    worker_calls = sum(r["worker_calls"] or 0 for r in ran)
    not_logged = await _not_logged(pool, scope)
    duplicated = (sum(n - 1 for n in stored.values() if n > 1)
                  + sum(n - 1 for n in positions.values() if n > 1)
                  + sum(n - 1 for n in terminals.values() if n > 1))
    return Report(
        fault=fault,
        accepted=len(accepted),
        terminal_once=sum(1 for c in accepted if terminals.get(c) == 1),
        published=len(published),
        persisted_once=sum(1 for e in published if stored.get(e) == 1),
        lost=len(published - set(stored)),
        duplicated=duplicated,
        unexpected=len(set(stored) - published),
        seq_gaps=gaps,
        repeated_turns=sum(n - 1 for n in cycles.values() if n > 1),
        repeated_tool_calls=None if tool_runs is None else max(0, tool_runs - worker_calls),
        not_logged=not_logged,
        parked=parked,
    )


async def _not_logged(pool: asyncpg.Pool, scope: set[uuid.UUID], timeout: float = 30) -> int:
    """Stored events of ``scope`` not under the latest checkpoint, once the ledger has
    had ``timeout`` seconds to catch up."""
    query = ("SELECT count(*) FROM event_log e LEFT JOIN ledger_leaves l USING (event_id) "
             "WHERE e.case_id = ANY($1::uuid[]) AND (l.leaf_index IS NULL OR l.leaf_index >= "
             "(SELECT coalesce(max(tree_size), 0) FROM ledger_checkpoints))")
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        missing: int = await pool.fetchval(query, list(scope))
        if missing == 0 or asyncio.get_running_loop().time() > deadline:
            return missing
        await asyncio.sleep(0.25)


HEADER = ("fault", "accepted cases", "terminal once", "awaiting review", "events published",
          "persisted once",
          "lost", "duplicated", "unexpected", "seq gaps", "repeated model turns",
          "repeated worker tool calls", "not in the log")


def table(reports: list[Report]) -> str:
    rows = [HEADER] + [(r.fault, *(str(v) for v in (
        r.accepted, r.terminal_once, r.parked, r.published, r.persisted_once, r.lost, r.duplicated,
        r.unexpected, r.seq_gaps, r.repeated_turns,
        "n/a" if r.repeated_tool_calls is None else r.repeated_tool_calls,
        r.not_logged))) for r in reports]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(HEADER))
    return "\n".join(lines)
