"""The message properties casetrail sets on what it publishes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pamqp.commands import Basic


@dataclass(frozen=True, slots=True)
class Properties:
    """A subset of AMQP's basic properties: the ones casetrail uses."""

    message_id: str
    content_type: str = "application/json"
    persistent: bool = True
    message_type: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration_ms: int | None = None
    headers: dict[str, Any] | None = None
    user_id: str | None = None
    """The publishing connection's broker user: RabbitMQ refuses a message whose
    user_id is not the connection's, so a consumer knows who published it."""

    def to_basic(self) -> Basic.Properties:
        """The same properties as pamqp's object, for aiormq's ``basic_publish``."""
        return Basic.Properties(
            content_type=self.content_type,
            headers=self.headers,
            delivery_mode=2 if self.persistent else 1,
            correlation_id=self.correlation_id or None,
            reply_to=self.reply_to or None,
            expiration=None if self.expiration_ms is None else str(self.expiration_ms),
            message_id=self.message_id,
            message_type=self.message_type or None,
            user_id=self.user_id or None,
        )
