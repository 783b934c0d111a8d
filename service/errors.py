"""The project's own error hierarchy.

Every third-party exception (aiormq, aio-pika, asyncpg, aiohttp) is
translated at the boundary into one of these, so the code above the adapters
decides by *kind*, never by library:

    CasetrailError
    ├── TransientError      retrying later may succeed (broker or database
    │   │                   unreachable, provider overloaded)
    │   ├── BusUnavailable
    │   ├── StoreUnavailable
    │   └── ModelUnavailable
    └── PermanentError      retrying the same thing will fail the same way
        ├── ModelRejected   the provider refused the request (4xx)
        ├── PublishRejected the broker refused or returned a message
        ├── ProviderPluginError an installed package's model provider is unusable
        └── Reject          a message that cannot be processed: dead-letter it

A tool failure is *not* an error here: it is an observation the model sees
(see ``casetrail.engine.tools``).
"""

from __future__ import annotations

import re

from casetrail.contract.dead_letters import DeadLetterCode


class CasetrailError(Exception):
    """Base of every error casetrail raises on purpose."""


class TransientError(CasetrailError):
    """A failure that retrying later may cure."""


class PermanentError(CasetrailError):
    """A failure that retrying the same operation will not cure."""


class BusUnavailable(TransientError):
    """RabbitMQ could not be reached or dropped the channel."""


class StoreUnavailable(TransientError):
    """Postgres could not be reached or dropped the connection."""


class ModelUnavailable(TransientError):
    """The chat model provider is overloaded, timed out or unreachable."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelRejected(PermanentError):
    """The chat model provider refused the request (bad request, auth, not found)."""


class PublishRejected(PermanentError):
    """The broker nacked or returned a published message."""


class Reject(PermanentError):
    """A message that can never be processed; it goes to the dead-letter queue.

    ``reason`` travels with the dead-lettered message so an operator can see
    why it was set aside.
    """

    def __init__(self, reason: str,
                 code: DeadLetterCode = DeadLetterCode.UNPROCESSABLE) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        """The reason's class, a word (the dead-letter metric's label)."""


MAX_MESSAGE = 500
_CREDENTIAL = re.compile(
    r"(?i)\b(?:sk|pk|rk|ak|key|token|secret|bearer)[-_ :=]+[A-Za-z0-9*._\-]{6,}")
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")  # http://user:password@proxy


def scrub(text: str) -> str:
    """``text`` with anything shaped like a credential replaced, at most 500 characters."""
    cleaned = _USERINFO.sub("[redacted]@", _CREDENTIAL.sub("[redacted]", text))
    return cleaned if len(cleaned) <= MAX_MESSAGE else cleaned[:MAX_MESSAGE] + "…"


class ProviderPluginError(PermanentError):
    """An installed package's model provider cannot be used (not loadable, not a
    ``ProviderSpec``, a name taken): nothing starts with it, and the message names the
    package and why."""
