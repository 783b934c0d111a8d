"""``casetrail ledger accept-size``: an operator's word, on the record, for a log that lost
its high-water mark (docs/operations.md, "The ledger lost its high-water mark").

The ledger will not sign again when it has signed before but can read neither of its
anchors (the state file beside its key, the log-head stream): it cannot tell a new
start from a database restored over a larger log. An operator who knows, from a
witness, a bundle or the backup's date, how far the log had been, accepts a size here.
The acceptance is a checkpoint the log's key signs at that size, kept in the append-only
``ledger_acceptances`` with the reason and who gave it, and written as the state file.
It is refused while any anchor can be read (that is not a lost mark: a tree behind it
is a rollback, which no acceptance undoes) and while a ledger runs.
"""

from __future__ import annotations

import asyncio
import getpass
from dataclasses import dataclass

from casetrail.adapters.bus.connection import connect_patiently
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import component_pool
from casetrail.adapters.store.ledger import LedgerStore
from casetrail.components.sequencer import (
    LEADER_KEY,
    TREE_SIZE_SQL,
    ledger_state,
    published_anchors,
)
from casetrail.config import Settings
from casetrail.errors import PermanentError
from casetrail.ledger.log_key import log_signer
from casetrail.ledger.note import Checkpoint, sign


@dataclass(frozen=True)
class Accepted:
    size: int
    root: bytes
    state_file: str


async def accept_size(settings: Settings, size: int, reason: str,
                      by: str | None = None) -> Accepted:
    """Accept ``size`` as the log's high-water mark; ``PermanentError`` saying why not."""
    if not reason.strip():
        raise PermanentError("--reason is required: the acceptance is kept on the record")
    signer = log_signer(settings)
    identity = settings.identity("ledger")
    pool = await component_pool(identity, 1, 10.0)
    connection = await connect_patiently(identity.amqp_url, "casetrail-ledger-accept", 10.0)
    try:
        async with pool.acquire() as conn:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_KEY):
                raise PermanentError("a ledger is running for this namespace: stop it first")
            state = ledger_state(settings)
            kept = await asyncio.to_thread(state.read, signer.verifier)
            anchors = [kept] if kept is not None else []
            anchors += await published_anchors(signer, connection,
                                               Topology(settings.namespace))
            if anchors:
                raise PermanentError(
                    f"the log's high-water mark is known ({anchors[0].describe()}): nothing "
                    "to accept. A stored tree behind it was rolled back; see "
                    "docs/operations.md, \"The log is behind\"")
            stored = await conn.fetchval(TREE_SIZE_SQL)
            if size > stored:
                raise PermanentError(f"the stored tree has {stored} leaves: a size of {size} "
                                     "cannot be accepted")
            root = await LedgerStore(conn).root(size)
            note = sign(Checkpoint(signer.name, size, root).text(), signer).render()
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO ledger_acceptances (tree_size, root_hash, note, reason, "
                    "accepted_by) VALUES ($1, $2, $3, $4, $5)",
                    size, root, note, reason.strip(), by or getpass.getuser())
                await asyncio.to_thread(state.write, note, reason=reason.strip())
    finally:
        await connection.close()
        await pool.close()
    return Accepted(size, root, str(state.path))
