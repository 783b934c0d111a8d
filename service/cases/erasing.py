"""Erasing a case's sensitive values: one procedure for ``POST /cases/{id}/erase`` and
``casetrail erase``, through the record (docs/design.md, "Served values").

The API signs the erasure with its action key (who asked, when) and sends it to the
worker, which checks that signature and appends the signed ``CASE_ERASED`` after the
case's last event; the database shreds the values (the key and ciphertext destroyed,
the digests of sensitive business keys deleted) in the statement that stores that
event, taking who and when from it. No component may shred values itself, so an
erasure is never without its event, and no component's database password erases
anyone's data. The request waits a few seconds for the values to be gone, so the
caller usually learns they are."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from casetrail.adapters.bus.journal import journal
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import CaseSecrets
from casetrail.contract.commands import EraseCommand
from casetrail.contract.events import ENDED_STATUSES, SignedPersonAction
from casetrail.contract.integrity import Signer
from casetrail.trail.person_actions import erase_object, sign_object

ERASED_WITHIN_SECONDS = 10.0
"""How long a request waits for the stored ``CASE_ERASED`` (and so the shredded values)
before it answers that the erasure is under way."""


@dataclass(frozen=True)
class Erasure:
    outcome: Literal["erased", "erasing", "already", "nothing", "running", "held",
                     "unsigned"]
    erased_at: datetime | None = None


async def erase(secrets: CaseSecrets, publisher: Publisher, topology: Topology,
                signer: Signer | None, case: dict[str, Any], by: str) -> Erasure:
    """Erase ``case`` (its ``cases`` row) as ``by`` asked. ``running``: not ended yet,
    nothing done; ``held``: a legal hold keeps its values; ``nothing``: it holds no
    sensitive values; ``already``: done before; ``unsigned``: this process holds no
    action key to sign it with; ``erasing``: sent, not stored yet."""
    case_id: uuid.UUID = case["case_id"]
    if case["status"] not in ENDED_STATUSES:
        return Erasure("running")
    state = await secrets.state(case_id)
    if state is None:
        return Erasure("nothing")
    if state.erased_at is not None:
        return Erasure("already", state.erased_at)
    if await secrets.held(case_id, case["tenant_id"]):
        return Erasure("held")
    if signer is None:
        return Erasure("unsigned")
    signed = sign_object(signer, erase_object(case_id, case["tenant_id"], by,
                                              datetime.now(UTC)))
    await journal(publisher, topology, {"kind": "erasure", "caseId": str(case_id),
                                        "tenantId": case["tenant_id"], "by": by})
    await publisher.publish(
        topology.commands_exchange, Topology.ERASE_KEY,
        EraseCommand(case_id=case_id, tenant_id=case["tenant_id"],
                     action=SignedPersonAction.model_validate(signed.as_json())).to_json(),
        message_type=EraseCommand.MESSAGE_TYPE, correlation_id=str(case_id),
        message_id=f"erase-{case_id}")
    await secrets.log_access(by, case["tenant_id"], case_id, "erase")
    deadline = time.monotonic() + ERASED_WITHIN_SECONDS
    while time.monotonic() < deadline:
        state = await secrets.state(case_id)
        if state is not None and state.erased_at is not None:
            return Erasure("erased", state.erased_at)
        await asyncio.sleep(0.1)
    return Erasure("erasing")
