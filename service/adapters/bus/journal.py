"""The retention journal on the bus (docs/operations.md, "Retention and legal holds"):
what people decided about keeping records, kept where a database restore cannot reach
it.

A hold, a release, a policy version, an approval, a business date or an erasure changes
rows in the namespace's database, so restoring a backup older than the change would
undo it: a released hold back in force is harmless, but a hold lost, or personal data
erased and then restored, is not. Each is therefore published, confirmed, to the stream
``<ns>.retention-journal`` (bound to ``<ns>.commands``, key ``retention.journal``; no
maximum age) before it is made. ``casetrail setup`` makes again whatever the restored
database lacks, and the workers' retention pass does not run while anything in the
journal is missing from the database (casetrail.components.retention).
"""

from __future__ import annotations

from typing import Any

import orjson
from aio_pika.abc import AbstractRobustConnection

from casetrail.adapters.bus.log_head import read_stream
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology

MESSAGE_TYPE = "RETENTION_JOURNAL"


async def journal(publisher: Publisher, topology: Topology, entry: dict[str, Any]) -> None:
    """Publish ``entry`` (``kind`` and its fields, JSON-ready), confirmed, persistent."""
    await publisher.publish(topology.commands_exchange, Topology.JOURNAL_KEY,
                            orjson.dumps(entry), message_type=MESSAGE_TYPE)


async def journalled(connection: AbstractRobustConnection, topology: Topology
                     ) -> list[dict[str, Any]]:
    """Every entry of the journal, oldest first."""
    return [orjson.loads(body)
            for body in await read_stream(connection, topology.retention_journal_stream,
                                          "first")]
