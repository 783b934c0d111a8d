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

from casetrail.adapters.store.ledger import LedgerStore
from casetrail.adapters.store.tree import keep_acceptance, tree_size
from casetrail.components.ledger_operator import stopped_ledger
from casetrail.config import Settings
from casetrail.errors import PermanentError
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
    async with stopped_ledger(settings, "accept") as ledger:
        if ledger.anchors:
            raise PermanentError(
                f"the log's high-water mark is known ({ledger.anchors[0].describe()}): "
                "nothing to accept. A stored tree behind it was rolled back; see "
                "docs/operations.md, \"The log is behind\"")
        conn, signer = ledger.conn, ledger.signer
        stored = await tree_size(conn)
        if size > stored:
            raise PermanentError(f"the stored tree has {stored} leaves: a size of {size} "
                                 "cannot be accepted")
        root = await LedgerStore(conn).root(size)
        note = sign(Checkpoint(signer.name, size, root).text(), signer).render()
        async with conn.transaction():
            await keep_acceptance(conn, size, root, note, reason.strip(),
                                  by or getpass.getuser())
            await asyncio.to_thread(ledger.state.write, note, reason=reason.strip())
    return Accepted(size, root, str(ledger.state.path))
