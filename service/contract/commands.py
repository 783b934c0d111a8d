"""Commands on the bus (not events): start, cancel and erase a case; a tool request
and its reply.

Like events they cross the bus as JSON bytes made here, and are validated
strictly when read.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import orjson
from pydantic import Field, ValidationError

from casetrail.contract.events import (
    DEFAULT_TENANT,
    ContractModel,
    JsonObject,
    SignedPersonAction,
    describe_validation_error,
)


class InvalidCommand(ValueError):
    """A command message that cannot be read; the message names the field."""


class _Command(ContractModel):
    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json", by_alias=True, exclude_none=True))

    @classmethod
    def from_json(cls, data: bytes) -> Any:
        try:
            return cls.model_validate(orjson.loads(data))
        except orjson.JSONDecodeError as exc:
            raise InvalidCommand(f"not valid JSON: {exc}") from None
        except ValidationError as exc:
            raise InvalidCommand(describe_validation_error(exc)) from None


class CaseStartCommand(_Command):
    """Run this case: sent once by the API after the case row is committed. It names
    the case only: the worker runs what the row says (input, model, limits, who started
    it), so a start command cannot change a case, and carries no applicant's data."""

    MESSAGE_TYPE: ClassVar[str] = "CASE_START"
    """The AMQP ``type`` of its messages."""

    case_id: uuid.UUID
    tenant_id: str = DEFAULT_TENANT
    agent: str


class CancelCommand(_Command):
    """Stop this case wherever it runs: broadcast to every worker."""

    MESSAGE_TYPE: ClassVar[str] = "CANCEL"

    case_id: uuid.UUID
    reason: str | None = None
    by: str | None = None


class EraseCommand(_Command):
    """Erase this case's sensitive values, as a person asked: the worker checks the
    API's signed action and appends the signed CASE_ERASED to the trail; the database
    shreds the values when that event is stored (docs/design.md, "Served values")."""

    MESSAGE_TYPE: ClassVar[str] = "CASE_ERASE"
    """The AMQP ``type`` of its messages."""

    case_id: uuid.UUID
    tenant_id: str = DEFAULT_TENANT
    action: SignedPersonAction | None = Field(
        default=None, description="The erasure as the API signed it with its action key "
        "(who asked, when); a command without one erases nothing.")


class ToolRequest(ContractModel):
    """One attempt of a worker tool call."""

    idempotency_key: str = Field(description="The same for every attempt of one call.")
    capability: str
    args: JsonObject = Field(description="The call's arguments, each sensitive value as its "
                             "placeholder (`[pii:applicantName]`), as in the events.")
    sealed: str | None = Field(default=None, description="The values those placeholders "
                               "stand for, sealed to the capability's own key (HPKE, "
                               "service/privacy/sealing.py); none when the arguments hold none.")
    attempt: int = Field(ge=1)
    deadline: float = Field(description="Unix time after which nobody waits for the answer.")


class ToolReply(ContractModel):
    """A capability worker's answer to one attempt."""

    idempotency_key: str
    attempt: int
    ok: bool
    result: Any = None
    error: str | None = None
    retryable: bool = False
    worker: str
