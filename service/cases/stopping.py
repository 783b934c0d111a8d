"""Stopping a case (cancel) and erasing its sensitive values. Only the worker emits
case events: a cancel and an erasure reach it as commands, and it records them."""

from __future__ import annotations

import uuid

from casetrail.cases.erasing import Erasure
from casetrail.cases.erasing import erase as erase_values
from casetrail.cases.errors import Conflict, NotAccepted, NotFound
from casetrail.cases.reading import owned
from casetrail.cases.reviewing import after_cancel, cancel_parked
from casetrail.cases.services import CaseServices
from casetrail.cases.text import refuse_unstorable
from casetrail.contract.auth import Principal
from casetrail.contract.commands import CancelCommand


async def cancel(services: CaseServices, principal: Principal, case_id: uuid.UUID,
                 reason: str | None = None) -> None:
    """Ask the case to stop: a queued case gets its ``CASE_CANCELLED`` from the worker
    that receives its start command, at once and without running it; a running one
    stops at its next step; one waiting for a person ends by its next attempt.
    ``Conflict`` when it has already ended."""
    refuse_unstorable(reason, "body", "reason")
    row = await owned(services, principal, case_id)
    # A case waiting for a person runs on no worker: the cancel is kept as what was
    # done about its wait, and its next attempt records CASE_CANCELLED.
    parked = await cancel_parked(services, row, principal.subject)
    outcome = await services.store.request_cancel(case_id, reason, principal.subject)
    if outcome == "unknown":
        raise NotFound(f"no case {case_id}")
    if outcome == "ended":
        raise Conflict(f"case {case_id} has already ended")
    if parked:
        await after_cancel(services, row)
        return
    await services.publisher.publish(
        services.topology.cancel_exchange, "",
        CancelCommand(case_id=case_id, reason=reason, by=principal.subject).to_json(),
        message_type=CancelCommand.MESSAGE_TYPE, correlation_id=str(case_id))


async def erase(services: CaseServices, principal: Principal, case_id: uuid.UUID) -> Erasure:
    """Erase the case's sensitive values through its record: the API signs the erasure,
    the worker appends the signed ``CASE_ERASED`` and the database destroys the data key
    and ciphertext (crypto-shredding) when it stores that event. The trail keeps its
    placeholders and every hash still verifies. ``Conflict`` when the case has not
    ended, holds no values or is held."""
    row = await owned(services, principal, case_id)
    done = await erase_values(services.secrets, services.publisher, services.topology,
                              services.action_signer, row, principal.subject)
    if done.outcome == "running":
        raise Conflict(f"case {case_id} is {row['status']}: erase it once it has ended")
    if done.outcome == "nothing":
        raise Conflict(f"case {case_id} holds no sensitive values")
    if done.outcome == "held":
        raise Conflict(f"case {case_id} is under a legal hold: its values are not erased "
                       "while it holds (GET /holds?caseId=...)")
    if done.outcome == "unsigned":
        raise NotAccepted("this process holds no action key (CASETRAIL_ACTION_KEY_FILE): an "
                          "erasure is made only signed")
    return done
