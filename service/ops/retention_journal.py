"""Holds, releases, policies, approvals, business dates and erasures that a restore
cannot undo (docs/operations.md, "Retention and legal holds").

The API publishes each to the stream ``<ns>.retention-journal`` before making it
(casetrail.adapters.bus.journal). After a restore, ``casetrail setup`` (the runbook's
second one) makes again, in the journal's order, every entry the restored database
lacks; until then the workers' retention pass does not run.
"""

from __future__ import annotations

from casetrail.adapters.bus.connection import connect
from casetrail.adapters.bus.journal import journalled
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import create_pool
from casetrail.adapters.store.journal import make_again, missing
from casetrail.config import Settings


def _named(entry: dict[str, object]) -> str:
    kind = entry["kind"]
    which = entry.get("holdId") or entry.get("caseId") or \
        f"{entry.get('tenantId')}/{entry.get('agent') or entry.get('field')}" \
        f"{'/v' + str(entry['version']) if 'version' in entry else ''}"
    return f"{kind} {which}"


async def reapply(settings: Settings) -> list[str]:
    """Make again what the journal holds and the database lacks; what was made."""
    connection = await connect(settings.amqp_url, "casetrail-setup")
    try:
        entries = await journalled(connection, Topology(settings.namespace))
    finally:
        await connection.close()
    if not entries:
        return []
    pool = await create_pool(settings.database_url, max_size=1)
    made = []
    try:
        for position in await missing(pool, entries):
            if await make_again(pool, entries[position]):
                made.append(_named(entries[position]))
    finally:
        await pool.close()
    return made
