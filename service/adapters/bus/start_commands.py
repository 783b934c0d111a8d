"""Sending a case's start command: the API when it accepts a case, a worker's sweeper
when the case was stranded (service/components/sweeper.py). One message shape for both."""

from __future__ import annotations

import uuid

from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.contract.commands import CaseStartCommand


async def send_start(publisher: Publisher, topology: Topology, case_id: uuid.UUID,
                     tenant_id: str, agent: str) -> None:
    """Publish the start command of ``case_id`` and wait for the broker's confirm (the
    publisher's errors: ``BusUnavailable``, ``PublishRejected``)."""
    command = CaseStartCommand(case_id=case_id, tenant_id=tenant_id, agent=agent)
    await publisher.publish(
        topology.commands_exchange, Topology.START_KEY, command.to_json(),
        message_id=str(case_id), message_type=CaseStartCommand.MESSAGE_TYPE,
        correlation_id=str(case_id),
    )
