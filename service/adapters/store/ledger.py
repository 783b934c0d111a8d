"""The transparency log in Postgres: what the API serves (checkpoints, proofs, leaves of
a case) and what the ledger appends. Proofs read only the tiles they need, in one query,
so one costs a few small reads whatever the size of the tree."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from casetrail.ledger import merkle
from casetrail.ledger.note import Note, NoteError, Signature, Verifier


@dataclass(frozen=True)
class StoredCheckpoint:
    size: int
    root: bytes
    note: str
    """The signed note as the log signed it."""
    created_at: Any
    cosignatures: str = ""
    """The witnesses' cosignature lines kept for it."""

    @property
    def served(self) -> str:
        """The note with its cosignatures: what the log serves and bundles carry."""
        return self.note + self.cosignatures


class UnknownCheckpoint(LookupError):
    """No checkpoint of that size."""


@dataclass(frozen=True)
class LedgerStore:
    pool: asyncpg.Pool | asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
    """A pool, or a connection already borrowed (the sequencer's, inside its append)."""

    async def _tiles(self, wanted: set[merkle.Tile]) -> dict[merkle.Tile, bytes]:
        if not wanted:
            return {}
        levels, indexes = zip(*sorted(wanted), strict=True)
        rows = await self.pool.fetch(
            "SELECT t.level, t.tile_index, t.hashes FROM unnest($1::smallint[], "
            "$2::bigint[]) AS w(level, tile_index) "
            "JOIN ledger_tiles t USING (level, tile_index)", list(levels), list(indexes))
        return {(r["level"], r["tile_index"]): bytes(r["hashes"]) for r in rows}

    async def range_hashes(self, ranges: Sequence[merkle.Range]) -> list[bytes]:
        """``MTH`` of each range, from one read of the tiles they need."""
        read = merkle.tile_entries(await self._tiles(merkle.tiles_for_proof(ranges)))
        return [merkle.range_hash(read, lo, hi) for lo, hi in ranges]

    async def inclusion(self, index: int, size: int) -> list[bytes]:
        return await self.range_hashes(merkle.inclusion_ranges(index, size))

    async def inclusions(self, indexes: Sequence[int], size: int) -> list[list[bytes]]:
        """The inclusion paths of several leaves in the tree of ``size``, from one read."""
        paths = [merkle.inclusion_ranges(i, size) for i in indexes]
        hashes = iter(await self.range_hashes([r for path in paths for r in path]))
        return [[next(hashes) for _ in path] for path in paths]

    async def consistency(self, old: int, new: int) -> list[bytes]:
        return await self.range_hashes(merkle.consistency_ranges(old, new))

    async def root(self, size: int) -> bytes:
        if size == 0:
            return merkle.EMPTY_ROOT
        return (await self.range_hashes([(0, size)]))[0]

    # -- checkpoints -------------------------------------------------------------------

    _SELECT = ("SELECT c.*, coalesce((SELECT string_agg(s.line, '' ORDER BY s.witness) "
               "FROM ledger_cosignatures s WHERE s.tree_size = c.tree_size), '') AS cosigned "
               "FROM ledger_checkpoints c ")

    def _checkpoint(self, row: asyncpg.Record) -> StoredCheckpoint:
        return StoredCheckpoint(row["tree_size"], bytes(row["root_hash"]), row["note"],
                                row["created_at"], row["cosigned"])

    async def latest(self) -> StoredCheckpoint | None:
        row = await self.pool.fetchrow(self._SELECT + "ORDER BY c.tree_size DESC LIMIT 1")
        return None if row is None else self._checkpoint(row)

    async def checkpoint(self, size: int) -> StoredCheckpoint:
        row = await self.pool.fetchrow(self._SELECT + "WHERE c.tree_size = $1", size)
        if row is None:
            raise UnknownCheckpoint(f"the log signed no checkpoint of size {size}")
        return self._checkpoint(row)

    async def first_cosigned_covering(self, size: int) -> StoredCheckpoint | None:
        """The earliest checkpoint of at least ``size`` leaves that a witness cosigned:
        the earliest witnessed time for every leaf below ``size``."""
        row = await self.pool.fetchrow(
            self._SELECT + "WHERE c.tree_size >= $1 AND EXISTS (SELECT 1 FROM "
            "ledger_cosignatures s WHERE s.tree_size = c.tree_size) ORDER BY c.tree_size "
            "LIMIT 1", size)
        return None if row is None else self._checkpoint(row)

    async def checkpoints(self, since: int, limit: int) -> list[StoredCheckpoint]:
        rows = await self.pool.fetch(
            self._SELECT + "WHERE c.tree_size > $1 ORDER BY c.tree_size LIMIT $2", since, limit)
        return [self._checkpoint(r) for r in rows]

    async def keep_cosignature(self, size: int, witness: str, signature: Signature) -> bool:
        """Keep a checked cosignature; ``False`` when that witness's was already kept."""
        status = await self.pool.execute(
            "INSERT INTO ledger_cosignatures (tree_size, witness, line) VALUES ($1, $2, $3) "
            "ON CONFLICT DO NOTHING", size, witness, signature.line())
        return status.endswith(" 1")

    async def verifier_keys(self) -> list[str]:
        rows = await self.pool.fetch("SELECT verifier_key FROM ledger_keys ORDER BY created_at")
        return [r["verifier_key"] for r in rows]

    # -- leaves ------------------------------------------------------------------------

    async def event_leaf(self, case_id: uuid.UUID, event_id: uuid.UUID
                         ) -> tuple[int, str] | None:
        """The leaf index and hash (the leaf's data) of an event of ``case_id``, or
        ``None`` when it is not in the log."""
        row = await self.pool.fetchrow(
            "SELECT leaf_index, event_hash FROM ledger_leaves WHERE event_id = $1 "
            "AND case_id = $2", event_id, case_id)
        return None if row is None else (row["leaf_index"], row["event_hash"])

    async def leaf_of_hash(self, event_hash: str) -> int | None:
        """The first leaf whose data is ``event_hash`` (64 hex), or ``None``."""
        index: int | None = await self.pool.fetchval(
            "SELECT min(leaf_index) FROM ledger_leaves WHERE event_hash = $1", event_hash)
        return index

    async def leaves_of_case(self, case_id: uuid.UUID) -> dict[uuid.UUID, int]:
        rows = await self.pool.fetch(
            "SELECT event_id, leaf_index FROM ledger_leaves WHERE case_id = $1", case_id)
        return {r["event_id"]: r["leaf_index"] for r in rows}

    async def leaf_hashes_of_case(self, case_id: uuid.UUID
                                  ) -> dict[uuid.UUID, tuple[int, str | None]]:
        """Each leaf of the case by event id: its index and the hash it holds."""
        rows = await self.pool.fetch(
            "SELECT event_id, leaf_index, event_hash FROM ledger_leaves WHERE case_id = $1",
            case_id)
        return {r["event_id"]: (r["leaf_index"], r["event_hash"]) for r in rows}


def cosignature_for(note_text: str, checkpoint: StoredCheckpoint, witnesses: Sequence[Verifier]
                    ) -> list[tuple[Verifier, Signature]]:
    """The valid cosignatures of known ``witnesses`` in ``note_text`` (a copy of the
    checkpoint's note with signature lines added). ``NoteError`` when the text is not
    the checkpoint's."""
    note = Note.parse(note_text)
    if note.text != Note.parse(checkpoint.note).text:
        raise NoteError(f"the note is not the checkpoint of size {checkpoint.size}")
    found = []
    for witness in witnesses:
        signature = note.signed_by(witness)
        if signature is not None:
            found.append((witness, signature))
    return found
