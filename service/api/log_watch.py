"""The API's own watch on the log (casetrail.ledger.vouching): the largest checkpoint on
the streams that keep them that the log's key signed, against the database's latest, so
that the log's routes never serve what the log has stopped vouching for."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from casetrail.adapters.bus.connection import BusConnection
from casetrail.adapters.bus.log_head import follow_stream
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store.ledger import LedgerStore, StoredCheckpoint
from casetrail.ledger.high_water import HighestSigned
from casetrail.ledger.note import Verifier
from casetrail.ledger.vouching import LogState, log_state
from casetrail.telemetry import metrics

log = logging.getLogger("casetrail.api")

KEYS_SECONDS = 10.0
"""A larger checkpoint no known key signed makes the watch read the log's keys again,
at most this often (a key registered since it started)."""


@dataclass
class LogWatch:
    """Follows the streams that keep the log's checkpoints for as long as the API runs."""

    ledger: LedgerStore
    highest: HighestSigned = field(default_factory=HighestSigned)
    keys: list[Verifier] = field(default_factory=list)
    keys_read_at: float = -KEYS_SECONDS
    stops: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    last: tuple[tuple[int, bytes] | None, int | None, LogState] | None = None
    """The last state worked out, with what it was worked out from."""

    async def open(self, connection: BusConnection, topology: Topology) -> None:
        """Follow both streams that keep the log's checkpoints, each from its first: the
        log-head stream (small, no maximum age) and the checkpoints stream (large, 90
        days), so that a flood of old checkpoints on one does not hide the largest."""
        await self._read_keys()
        for name in (topology.log_head_stream, topology.checkpoints_stream):
            stop = await follow_stream(connection, name, self._take)
            if stop is not None:
                self.stops.append(stop)

    async def close(self) -> None:
        for stop in self.stops:
            await stop()

    async def _read_keys(self) -> None:
        self.keys = [Verifier.parse(k) for k in await self.ledger.verifier_keys()]
        self.keys_read_at = time.monotonic()

    async def _take(self, body: bytes) -> None:
        if self.highest.offer(body, self.keys) is None \
                and time.monotonic() - self.keys_read_at >= KEYS_SECONDS:
            await self._read_keys()
            self.highest.offer(body, self.keys)

    async def state(self, latest: StoredCheckpoint | None) -> LogState:
        """The log's state, given the database's latest checkpoint."""
        stored = (latest.size, latest.root) if latest is not None else None
        anchor = self.highest.best
        seen = (stored, anchor.size if anchor else None)
        if self.last is not None and self.last[:2] == seen:
            return self.last[2]
        state = await log_state(stored, anchor, self.highest.note, self.ledger.root)
        if state.halted and (self.last is None or not self.last[2].halted):
            log.error("%s", state.detail)
        metrics.LOG_SERVED_HALTED.set(1 if state.halted else 0)
        self.last = (*seen, state)
        return state
