"""An operator's act on the log with its ledger stopped (``ledger accept-size``,
``ledger recover``): the ledger's own identity, its lock held so that no ledger runs
meanwhile, and the high-water mark as kept off the database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from casetrail.adapters.bus.connection import connect_patiently
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import component_pool
from casetrail.adapters.store.pool import Connection
from casetrail.adapters.store.tree import try_to_lead
from casetrail.components.sequencer import ledger_state, published_anchors
from casetrail.config import Settings
from casetrail.errors import PermanentError
from casetrail.ledger.high_water import Anchor, StateFile
from casetrail.ledger.log_key import log_signer
from casetrail.ledger.note import NoteSigner


@dataclass(frozen=True)
class StoppedLedger:
    conn: Connection
    signer: NoteSigner
    state: StateFile
    anchors: list[Anchor]
    """The state file's checkpoint first, then the streams'."""


@asynccontextmanager
async def stopped_ledger(settings: Settings, purpose: str) -> AsyncIterator[StoppedLedger]:
    """The log as an operator may change it; ``PermanentError`` while a ledger runs."""
    signer = log_signer(settings)
    identity = settings.identity("ledger")
    pool = await component_pool(identity, 1, 10.0)
    try:
        connection = await connect_patiently(identity.amqp_url, f"casetrail-ledger-{purpose}",
                                             10.0)
        try:
            async with pool.acquire() as conn:
                if not await try_to_lead(conn):
                    raise PermanentError("a ledger is running for this namespace: stop it "
                                         "first")
                state = ledger_state(settings)
                kept = await asyncio.to_thread(state.read, signer.verifier)
                anchors = [kept] if kept is not None else []
                anchors += await published_anchors(signer, connection,
                                                   Topology(settings.namespace))
                yield StoppedLedger(conn, signer, state, anchors)
        finally:
            await connection.close()
    finally:
        await pool.close()
