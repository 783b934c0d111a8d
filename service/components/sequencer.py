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

**It knows how far it has been.** Its high-water mark, the largest checkpoint it signed,
is kept off its database (casetrail.ledger.high_water): a state file beside its key,
written before a checkpoint is stored, and the log-head stream. A stored tree that does
not hold it (a database restored from an older backup) halts the ledger: it signs
nothing, says both sizes, sets ``casetrail_ledger_halted`` and exits 3 when stopped. A
log that signed before but whose anchors are both gone waits for an operator's
``casetrail ledger accept-size``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from casetrail.adapters.bus.connection import BusConnection
from casetrail.adapters.bus.log_head import published_checkpoints
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import translate_errors
from casetrail.adapters.store.ledger import LedgerStore, StoredCheckpoint
from casetrail.adapters.store.pool import Connection, Pool
from casetrail.adapters.store.tree import (
    DuplicateLeaf,
    QueuedLeaf,
    already_leaves,
    appending,
    has_checkpoints,
    keep_checkpoint,
    queued,
    read_edge,
    register_log_key,
    take_queued,
    tree_size,
    try_to_lead,
    write_leaves,
)
from casetrail.components.runtime import component
from casetrail.components.supervisor import run_until_signal
from casetrail.config import Settings
from casetrail.errors import BusUnavailable, PermanentError, PublishRejected, StoreUnavailable
from casetrail.ledger import merkle
from casetrail.ledger.high_water import (
    Anchor,
    HaltReason,
    LogHalted,
    StateFile,
    check_tree,
    from_stream,
    state_file_for,
)
from casetrail.ledger.log_key import log_signer
from casetrail.ledger.note import Checkpoint, Note, NoteSigner, sign
from casetrail.telemetry import metrics

log = logging.getLogger("casetrail.ledger")

IDLE_SECONDS = 0.2
"""How long the sequencer waits when the queue was empty."""
RETRY_SECONDS = 1.0
"""How long it waits after Postgres went away."""
HALTED_REPEAT_SECONDS = 60.0
"""A halted ledger repeats why, this often."""


@dataclass
class Sequencer:
    """Appends queued events to the tree and signs checkpoints."""

    pool: Pool
    signer: NoteSigner
    batch_size: int = 5000
    state: StateFile | None = None
    """Where the high-water mark is kept; ``None`` for a sequencer that keeps none (a
    test's, signing into a database of its own)."""
    anchors: list[Anchor] = field(default_factory=list)
    """Checkpoints this log signed, read off its database (the state file, the bus)."""
    edge: merkle.Edge = field(default_factory=merkle.Edge)
    signed_size: int = -1

    @property
    def store(self) -> LedgerStore:
        return LedgerStore(self.pool)

    async def start(self) -> None:
        """Read the stored tree, check it against the last checkpoint, register the key."""
        async with self.pool.acquire() as conn:
            self.edge = await read_edge(conn)
            signed_before = await has_checkpoints(conn)
        last = await self.store.latest()
        if last is not None:
            await self._check_against(last)
        if self.state is not None:
            kept = await asyncio.to_thread(self.state.read, self.signer.verifier)
            self.anchors = [kept, *self.anchors] if kept is not None else self.anchors
        for anchor in self.anchors:
            log.info("high-water mark: %s", anchor.describe())
        if self.state is not None and not self.anchors and signed_before:
            raise LogHalted(HaltReason.NO_ANCHOR, (
                f"this log has signed before, but its state file {self.state.path} is "
                "missing and the bus holds none of its checkpoints: the high-water mark is "
                f"unknown (the stored tree has {self.edge.size} leaves). Restore the state "
                "file, or accept a size on the record with `casetrail ledger accept-size N "
                "--reason ...`"))
        # (Outside any borrowed connection: the root is read through the pool.)
        await check_tree(self.anchors, self.edge.size, self.store.root)
        await register_log_key(self.pool, self.signer.verifier.text(), self.signer.name)
        if last is not None:
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
        except DuplicateLeaf:
            # An event queued twice (an operator's re-queue): the batch again, without it.
            return await self._append(check_logged=True)

    async def _append(self, *, check_logged: bool) -> int:
        began = time.perf_counter()
        async with self.pool.acquire() as conn, appending(conn):
            stored = await tree_size(conn)
            if stored < self.edge.size:
                raise LogHalted(HaltReason.BEHIND, (
                    f"the stored tree has {stored} leaves but this ledger appended "
                    f"{self.edge.size}: its database was rolled back while it ran"))
            if stored > self.edge.size:
                log.warning("the tree grew under this ledger (another sequencer?); "
                            "reading its edge again")
                self.edge = await read_edge(conn)
                await check_tree(self.anchors, self.edge.size, LedgerStore(conn).root)
            rows = await take_queued(conn, self.batch_size)
            if not rows:
                return 0
            if check_logged:
                rows = await self._not_yet_logged(conn, rows)
            edge = self.edge.copy()
            first = edge.size
            tiles = edge.append([merkle.leaf_hash(bytes.fromhex(r.hash)) for r in rows])
            await write_leaves(conn, first, [(r.event_id, r.case_id, r.hash, r.kind)
                                             for r in rows], tiles)
        self.edge = edge
        metrics.LEDGER_LEAVES.inc(len(rows))
        metrics.LEDGER_TREE_SIZE.set(edge.size)
        metrics.LEDGER_APPEND_SECONDS.observe(time.perf_counter() - began)
        return len(rows)

    @staticmethod
    async def _not_yet_logged(conn: Connection, rows: Sequence[QueuedLeaf]
                              ) -> list[QueuedLeaf]:
        """An event is a leaf once: one queued twice (an operator's re-queue) is dropped."""
        logged = await already_leaves(conn, [r.event_id for r in rows])
        seen: set[uuid.UUID] = set()
        kept = []
        for row in rows:
            if row.event_id not in logged and row.event_id not in seen:
                seen.add(row.event_id)
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
        if self.state is not None:  # the high-water mark first: a restore cannot undo it
            await asyncio.to_thread(self.state.write, note.render())
            self.anchors = [Anchor(head, note.render(), f"state file {self.state.path}")]
        await keep_checkpoint(self.pool, head.size, head.root, note.render())
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
                        metrics.LEDGER_BACKLOG.set(await queued(self.sequencer.pool))
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


def ledger_state(settings: Settings) -> StateFile:
    """The ledger's state file (``CASETRAIL_LEDGER_STATE_FILE``, else beside its key)."""
    return StateFile(state_file_for(settings.log_key_file or "", settings.namespace,
                                    settings.ledger_state_file))


async def published_anchors(signer: NoteSigner, connection: BusConnection,
                            topology: Topology) -> list[Anchor]:
    """The checkpoints this log signed, as kept on the bus (the state file is the
    sequencer's own to read)."""
    anchors = []
    for name, bodies in await published_checkpoints(connection, topology):
        found = from_stream(bodies, signer.verifier, f"stream {name}")
        if found is not None:
            anchors.append(found)
    return anchors


async def halt(halted: LogHalted, stop: asyncio.Event) -> None:
    """Sign nothing, and say so until stopped: an ERROR line a minute and the
    ``casetrail_ledger_halted`` gauge (alert CasetrailLedgerHalted); then raise."""
    metrics.LEDGER_HALTED.labels(halted.reason.value).set(1)
    while not stop.is_set():
        log.error("the ledger is halted (%s): %s", halted.reason.value, halted)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HALTED_REPEAT_SECONDS)
    raise halted


async def run_ledger(settings: Settings) -> None:
    """The ``casetrail ledger`` component, until SIGINT or SIGTERM; ``LogHalted`` when it
    would not sign (exit 3)."""
    signer = log_signer(settings)
    async with component(settings, "ledger") as parts:
        pool = await parts.pool(2)
        lock = await pool.acquire()
        parts.stack.push_async_callback(pool.release, lock)
        while not await try_to_lead(lock):
            log.info("another ledger holds the log; standing by")
            await asyncio.sleep(2.0)
        connection = await parts.connection()
        topology = Topology(settings.namespace)
        channel = await connection.channel()
        await topology.require(channel)
        await channel.close()
        sequencer = Sequencer(pool, signer, settings.ledger_batch_size, ledger_state(settings))
        try:
            sequencer.anchors = await published_anchors(signer, connection, topology)
            await sequencer.start()
            ledger = Ledger(sequencer, await Publisher.open(connection), topology,
                            settings.checkpoint_seconds)
            await run_until_signal(ledger.run)
        except LogHalted as halted:
            await run_until_signal(functools.partial(halt, halted))
    log.info("ledger stopped at %d leaves", sequencer.edge.size)
