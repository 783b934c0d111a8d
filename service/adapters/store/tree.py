"""The log's tree as the ledger writes it (docs/design.md, "The transparency log"):
its leaves and tiles, the queue of events waiting to become leaves, checkpoints, the
log's key, an operator's accepted size, and the two advisory locks (one ledger at a
time; one append at a time). What the API and verifiers read of the tree is
``ledger.py``'s ``LedgerStore``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg

from casetrail.adapters.store.pool import Connection, Pool
from casetrail.errors import PermanentError
from casetrail.ledger import merkle

LEADER_KEY = 0x6361736574726C67
"""The session advisory lock the running ledger holds (each namespace has its own
database); a second ledger, or an operator's change, waits for it."""
APPEND_KEY = LEADER_KEY + 1
"""The transaction advisory lock every append takes."""

TREE_SIZE_SQL = "SELECT coalesce(max(leaf_index) + 1, 0) FROM ledger_leaves"
"""Leaves in the stored tree (from the primary key's end)."""

DuplicateLeaf = asyncpg.UniqueViolationError
"""An event queued twice would become a second leaf: the append is refused whole."""


@dataclass(frozen=True)
class QueuedLeaf:
    """An event (or a backtest's record: ``kind``) waiting to become a leaf."""

    queued_id: int
    event_id: uuid.UUID
    case_id: uuid.UUID
    hash: str
    kind: str


async def tree_size(conn: Connection | Pool) -> int:
    return int(await conn.fetchval(TREE_SIZE_SQL))


async def read_edge(conn: Connection) -> merkle.Edge:
    """The right edge of the stored tree; ``PermanentError`` if its tiles do not match
    its leaves."""
    size = await tree_size(conn)
    partial: dict[int, list[bytes]] = {}
    for level, (index, width) in merkle.Edge.widths(size).items():
        stored = await conn.fetchval(
            "SELECT hashes FROM ledger_tiles WHERE level = $1 AND tile_index = $2",
            level, index)
        if width == 0:
            if stored is not None:
                raise PermanentError(f"tile {level}/{index} exists beyond a tree of {size}")
            continue
        if stored is None or len(stored) != width * merkle.HASH_SIZE:
            raise PermanentError(f"tile {level}/{index} does not hold the {width} hashes a "
                                 f"tree of {size} leaves needs")
        partial[level] = [bytes(stored[i:i + 32]) for i in range(0, len(stored), 32)]
    return merkle.Edge(size, partial)


async def write_leaves(conn: Connection, first: int,
                       leaves: Sequence[tuple[uuid.UUID, uuid.UUID, str, str]],
                       tiles: dict[merkle.Tile, bytes]) -> None:
    """Leaves ``first`` … as (event id, case id, event hash, kind), and the tiles they
    changed (inside the caller's transaction). A leaf of the kind ``backtest`` stands for
    a backtest's record: its ids are the backtest's."""
    await conn.execute(
        "INSERT INTO ledger_leaves (leaf_index, event_id, case_id, event_hash, kind) "
        "SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::uuid[], $4::text[], $5::text[])",
        list(range(first, first + len(leaves))), [leaf[0] for leaf in leaves],
        [leaf[1] for leaf in leaves], [leaf[2] for leaf in leaves],
        [leaf[3] for leaf in leaves])
    keys = sorted(tiles)
    await conn.execute(
        "INSERT INTO ledger_tiles (level, tile_index, hashes) "
        "SELECT * FROM unnest($1::smallint[], $2::bigint[], $3::bytea[]) "
        "ON CONFLICT (level, tile_index) DO UPDATE SET hashes = EXCLUDED.hashes",
        [k[0] for k in keys], [k[1] for k in keys], [tiles[k] for k in keys])


@asynccontextmanager
async def appending(conn: Connection) -> AsyncIterator[Connection]:
    """A transaction holding the append lock: what is read and written inside is one
    append, and no other append interleaves."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", APPEND_KEY)
        yield conn


async def take_queued(conn: Connection, limit: int) -> list[QueuedLeaf]:
    """Up to ``limit`` queued events, oldest first, taken off the queue (inside the
    append's transaction: a failed append puts them back)."""
    rows = await conn.fetch(
        "DELETE FROM ledger_queue WHERE queued_id IN (SELECT queued_id FROM "
        "ledger_queue ORDER BY queued_id LIMIT $1) "
        "RETURNING queued_id, event_id, case_id, hash, kind", limit)
    return sorted((QueuedLeaf(r["queued_id"], r["event_id"], r["case_id"], r["hash"],
                              r["kind"]) for r in rows), key=lambda q: q.queued_id)


async def already_leaves(conn: Connection, event_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    return {r["event_id"] for r in await conn.fetch(
        "SELECT event_id FROM ledger_leaves WHERE event_id = ANY($1::uuid[])", event_ids)}


async def queued(pool: Pool) -> int:
    """Events waiting to become leaves."""
    return int(await pool.fetchval("SELECT count(*) FROM ledger_queue"))


async def has_checkpoints(conn: Connection) -> bool:
    """Whether this log ever signed a checkpoint into its database."""
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM ledger_checkpoints)"))


async def register_log_key(pool: Pool, verifier_key: str, origin: str) -> None:
    await pool.execute("INSERT INTO ledger_keys (verifier_key, origin) VALUES ($1, $2) "
                       "ON CONFLICT DO NOTHING", verifier_key, origin)


async def keep_checkpoint(pool: Pool, size: int, root: bytes, note: str) -> None:
    await pool.execute(
        "INSERT INTO ledger_checkpoints (tree_size, root_hash, note) VALUES ($1, $2, $3) "
        "ON CONFLICT DO NOTHING", size, root, note)


async def keep_acceptance(conn: Connection, size: int, root: bytes, note: str, reason: str,
                          by: str) -> None:
    """An operator's accepted size, kept on the record (inside the caller's transaction)."""
    await conn.execute(
        "INSERT INTO ledger_acceptances (tree_size, root_hash, note, reason, accepted_by) "
        "VALUES ($1, $2, $3, $4, $5)", size, root, note, reason, by)


async def try_to_lead(conn: Connection) -> bool:
    """Take the ledger's session lock on ``conn`` if no other ledger holds it."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_KEY))
