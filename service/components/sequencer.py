"""``casetrail ledger``: the one sequencer of the transparency log.

It takes stored events from ``ledger_queue`` (filled by a trigger in the consumer's own
transaction, so an event is queued exactly when it is committed) in order, appends their
hashes as leaves, writes the tiles that changed, and deletes them from the queue, all in
one transaction: a crash anywhere leaves either the whole batch appended or none of it.
Whenever the tree grew, at most every ``CASETRAIL_CHECKPOINT_SECONDS``, it signs a
checkpoint, keeps it and publishes it on ``<ns>.events`` as ``ledger.checkpoint``.

**One sequencer, even with two.** A ledger holds a session advisory lock while it runs;
a second one started beside it stands by until the first goes. Each append also takes a
transaction-level advisory lock and checks the tree's size in the database against its
own before it writes, so two appenders (a lock lost with its connection, say) never
interleave: the second re-reads the edge and goes on from there.

**Its own first witness.** At start the ledger reads the tree back and checks that the
last checkpoint it signed is still the root of the stored tree at that size; a tree
altered underneath it is refused (exit 2), not signed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import translate_errors
from casetrail.adapters.store.ledger import LedgerStore, StoredCheckpoint
from casetrail.components.runtime import component
from casetrail.components.supervisor import run_until_signal
from casetrail.config import LOCAL_DIR, Settings
from casetrail.errors import BusUnavailable, PermanentError, PublishRejected, StoreUnavailable
from casetrail.ledger import merkle
from casetrail.ledger.note import ED25519, Checkpoint, Note, NoteError, NoteSigner, sign
from casetrail.telemetry import metrics

log = logging.getLogger("casetrail.ledger")

Queries = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
"""A connection, or one borrowed from a pool."""

LEADER_KEY = 0x6361736574726C67
"""The session advisory lock the running ledger holds (each namespace has its own
database); a second ledger waits for it."""
APPEND_KEY = LEADER_KEY + 1
"""The transaction advisory lock every append takes."""

IDLE_SECONDS = 0.2
"""How long the sequencer waits when the queue was empty."""
RETRY_SECONDS = 1.0
"""How long it waits after Postgres went away."""


TREE_SIZE_SQL = "SELECT coalesce(max(leaf_index) + 1, 0) FROM ledger_leaves"
"""Leaves in the stored tree (from the primary key's end)."""


async def read_edge(conn: Queries) -> merkle.Edge:
    """The right edge of the stored tree; ``PermanentError`` if its tiles do not match
    its leaves."""
    size = await conn.fetchval(TREE_SIZE_SQL)
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


@dataclass
class Sequencer:
    """Appends queued events to the tree and signs checkpoints."""

    pool: asyncpg.Pool
    signer: NoteSigner
    batch_size: int = 5000
    edge: merkle.Edge = field(default_factory=merkle.Edge)
    signed_size: int = -1

    @property
    def store(self) -> LedgerStore:
        return LedgerStore(self.pool)

    async def start(self) -> None:
        """Read the stored tree, check it against the last checkpoint, register the key."""
        async with self.pool.acquire() as conn:
            self.edge = await read_edge(conn)
            await conn.execute(
                "INSERT INTO ledger_keys (verifier_key, origin) VALUES ($1, $2) "
                "ON CONFLICT DO NOTHING", self.signer.verifier.text(), self.signer.name)
        last = await self.store.latest()
        if last is not None:
            await self._check_against(last)
            self.signed_size = last.size
            if Note.parse(last.note).signed_by(self.signer.verifier) is None:
                log.warning("the log's key changed: its last checkpoint (size %d) was signed "
                            "by another key; witnesses and verifiers need the new verifier "
                            "key %s", last.size, self.signer.verifier.text())
            metrics.LEDGER_CHECKPOINT_SIZE.set(last.size)
        metrics.LEDGER_TREE_SIZE.set(self.edge.size)
        log.info("ledger %s: tree of %d leaves, last checkpoint %s", self.signer.name,
                 self.edge.size, "none" if last is None else last.size)

    async def _check_against(self, last: StoredCheckpoint) -> None:
        if last.size > self.edge.size:
            raise PermanentError(f"the last checkpoint has {last.size} leaves but the stored "
                                 f"tree only {self.edge.size}: the tree lost leaves")
        root = await self.store.root(last.size)
        if root != last.root:
            raise PermanentError(f"the stored tree's root at {last.size} leaves is not the "
                                 "one the last checkpoint signed: the tree was altered")

    async def append(self) -> int:
        """Append up to ``batch_size`` queued events; the number appended."""
        try:
            return await self._append(check_logged=False)
        except asyncpg.UniqueViolationError:
            # An event queued twice (an operator's re-queue): the batch again, without it.
            return await self._append(check_logged=True)

    async def _append(self, *, check_logged: bool) -> int:
        began = time.perf_counter()
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", APPEND_KEY)
            if await conn.fetchval(TREE_SIZE_SQL) != self.edge.size:
                log.warning("the tree grew under this ledger (another sequencer?); "
                            "reading its edge again")
                self.edge = await read_edge(conn)
            rows = await conn.fetch(
                "DELETE FROM ledger_queue WHERE queued_id IN (SELECT queued_id FROM "
                "ledger_queue ORDER BY queued_id LIMIT $1) "
                "RETURNING queued_id, event_id, case_id, hash", self.batch_size)
            if not rows:
                return 0
            rows = sorted(rows, key=lambda r: r["queued_id"])
            if check_logged:
                rows = await self._not_yet_logged(conn, rows)
            edge = self.edge.copy()
            first = edge.size
            tiles = edge.append([merkle.leaf_hash(bytes.fromhex(r["hash"])) for r in rows])
            await conn.execute(
                "INSERT INTO ledger_leaves (leaf_index, event_id, case_id, event_hash) "
                "SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::uuid[], $4::text[])",
                list(range(first, first + len(rows))), [r["event_id"] for r in rows],
                [r["case_id"] for r in rows], [r["hash"] for r in rows])
            keys = sorted(tiles)
            await conn.execute(
                "INSERT INTO ledger_tiles (level, tile_index, hashes) "
                "SELECT * FROM unnest($1::smallint[], $2::bigint[], $3::bytea[]) "
                "ON CONFLICT (level, tile_index) DO UPDATE SET hashes = EXCLUDED.hashes",
                [k[0] for k in keys], [k[1] for k in keys], [tiles[k] for k in keys])
        self.edge = edge
        metrics.LEDGER_LEAVES.inc(len(rows))
        metrics.LEDGER_TREE_SIZE.set(edge.size)
        metrics.LEDGER_APPEND_SECONDS.observe(time.perf_counter() - began)
        return len(rows)

    @staticmethod
    async def _not_yet_logged(conn: Queries, rows: Sequence[asyncpg.Record]
                              ) -> list[asyncpg.Record]:
        """An event is a leaf once: one queued twice (an operator's re-queue) is dropped."""
        ids = [r["event_id"] for r in rows]
        logged = {r["event_id"] for r in await conn.fetch(
            "SELECT event_id FROM ledger_leaves WHERE event_id = ANY($1::uuid[])", ids)}
        seen: set[uuid.UUID] = set()
        kept = []
        for row in rows:
            if row["event_id"] not in logged and row["event_id"] not in seen:
                seen.add(row["event_id"])
                kept.append(row)
        if len(kept) != len(rows):
            log.warning("%d queued events were already leaves; dropped", len(rows) - len(kept))
        return kept

    async def drain(self) -> int:
        """Append until the queue is empty; the number appended."""
        total = 0
        while True:
            appended = await self.append()
            total += appended
            if appended < self.batch_size:
                return total

    @property
    def grew(self) -> bool:
        """The tree has leaves no checkpoint signed yet."""
        return self.edge.size > self.signed_size

    async def checkpoint(self) -> Note | None:
        """Sign the tree as it is now, if it grew since the last checkpoint."""
        if not self.grew:
            return None
        head = Checkpoint(self.signer.name, self.edge.size, self.edge.root())
        note = sign(head.text(), self.signer)
        await self.pool.execute(
            "INSERT INTO ledger_checkpoints (tree_size, root_hash, note) VALUES ($1, $2, $3) "
            "ON CONFLICT DO NOTHING", head.size, head.root, note.render())
        self.signed_size = head.size
        metrics.LEDGER_CHECKPOINTS.inc()
        metrics.LEDGER_CHECKPOINT_SIZE.set(head.size)
        return note


@dataclass
class Ledger:
    """The component: the sequencer's loop, with checkpoints published on the bus."""

    sequencer: Sequencer
    publisher: Publisher
    topology: Topology
    checkpoint_seconds: float
    _unpublished: Note | None = None

    async def run(self, stop: asyncio.Event) -> None:
        last_checkpoint = 0.0
        while not stop.is_set():
            try:
                async with translate_errors():
                    appended = await self.sequencer.append()
                    now = time.monotonic()
                    if appended == 0:
                        metrics.LEDGER_BACKLOG.set(0)  # the queue was empty just now
                    # Idle (nothing to sign or publish), a tick costs no query.
                    due = self.sequencer.grew or self._unpublished is not None
                    if due and appended < self.sequencer.batch_size and \
                            now - last_checkpoint >= self.checkpoint_seconds:
                        note = await self.sequencer.checkpoint()
                        if note is not None:
                            last_checkpoint = now
                            self._unpublished = note
                        await self._publish()
                        metrics.LEDGER_BACKLOG.set(await self.sequencer.pool.fetchval(
                            "SELECT count(*) FROM ledger_queue"))
            except StoreUnavailable as exc:
                # A batch is one transaction: nothing half-appended. Wait and go on.
                log.warning("%s; appending again in %.0f s", exc, RETRY_SECONDS)
                appended = 0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RETRY_SECONDS)
                continue
            if appended == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), IDLE_SECONDS)
        # A last checkpoint of what was appended, so a clean stop leaves nothing unsigned.
        with contextlib.suppress(StoreUnavailable):
            async with translate_errors():
                self._unpublished = await self.sequencer.checkpoint() or self._unpublished
        await self._publish()

    async def _publish(self) -> None:
        note = self._unpublished
        if note is None:
            return
        try:
            await self.publisher.publish(
                self.topology.events_exchange, self.topology.CHECKPOINT_KEY,
                note.render().encode(), message_type="ledger.checkpoint")
        except (BusUnavailable, PublishRejected) as exc:  # it is in Postgres: retried
            log.warning("checkpoint not published yet (%s); retrying", exc)
            return
        self._unpublished = None


# -- the log's key --------------------------------------------------------------------

def write_log_key(path: Path, signer: NoteSigner) -> None:
    """Write a signer key to ``path`` (mode 0600); refuses to overwrite one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(signer.text() + "\n")


def read_log_key(path: Path, kind: int = ED25519) -> NoteSigner:
    try:
        signer = NoteSigner.parse(path.read_text())
    except OSError as exc:
        raise PermanentError(f"cannot read the key {path}: {exc.strerror}") from None
    except NoteError as exc:
        raise PermanentError(f"{path} is not a signed-note signer key: {exc}") from None
    if signer.kind != kind:
        raise PermanentError(f"{path} holds a key of type {signer.kind:#04x}, not "
                             f"{kind:#04x}")
    return signer


def log_signer(settings: Settings) -> NoteSigner:
    """The log's key (``CASETRAIL_LOG_KEY_FILE``), named after the log's origin."""
    if not settings.log_key_file:
        raise PermanentError(
            "CASETRAIL_LOG_KEY_FILE is not set: the ledger signs every checkpoint. Create a "
            "key with `casetrail ledger key generate -o FILE` and point the variable at it.")
    signer = read_log_key(Path(settings.log_key_file))
    if signer.name != settings.origin():
        raise PermanentError(f"the log key is named {signer.name!r}, but the log's origin is "
                             f"{settings.origin()!r} (CASETRAIL_LOG_ORIGIN): a checkpoint's "
                             "signer is named after its origin")
    return signer


def ensure_local_log_key(settings: Settings) -> Settings:
    """For a developer stack (``up``, ``demo``): the configured log key, or one made and
    kept under ``.casetrail/`` for this namespace. Children started later inherit it."""
    if settings.log_key_file:
        return settings
    path = LOCAL_DIR / f"{settings.namespace}.log-key"
    if not path.exists():
        write_log_key(path, NoteSigner.generate(settings.origin()))
    os.environ["CASETRAIL_LOG_KEY_FILE"] = str(path.resolve())
    return settings.model_copy(update={"log_key_file": str(path.resolve())})


async def run_ledger(settings: Settings) -> None:
    """The ``casetrail ledger`` component, until SIGINT or SIGTERM."""
    signer = log_signer(settings)
    async with component(settings, "ledger") as parts:
        pool = await parts.pool(2)
        lock = await pool.acquire()
        parts.stack.push_async_callback(pool.release, lock)
        while not await lock.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_KEY):
            log.info("another ledger holds the log; standing by")
            await asyncio.sleep(2.0)
        sequencer = Sequencer(pool, signer, settings.ledger_batch_size)
        await sequencer.start()
        connection = await parts.connection()
        topology = Topology(settings.namespace)
        channel = await connection.channel()
        await topology.require(channel)
        await channel.close()
        ledger = Ledger(sequencer, await Publisher.open(connection), topology,
                        settings.checkpoint_seconds)
        await run_until_signal(ledger.run)
    log.info("ledger stopped at %d leaves", sequencer.edge.size)
