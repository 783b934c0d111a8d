"""Dead letters an operator can act on: list them, show one, send one back.

Whatever a component cannot process is set aside on ``<ns>.dead-letters`` with the
reason (``casetrail.adapters.bus.dead_letter``: the original headers kept, the reason, where it
came from and when added), or by the broker itself when a message exceeded its queue's
delivery limit (``x-death``). Reading them never removes them: they are taken without an
acknowledgement and handed back when the channel closes.

A redrive republishes a message to the exchange and routing key it came from, as the
component that first published it, with its headers (an event's signature included)
and ``x-casetrail-redriven-at``; once the broker confirms it, the dead letter is
acknowledged. A message that comes back after a redrive is not sent again unless asked
(``again``): once, and the record travels with the message.

Who first published it is taken only from what the broker vouched for, since any
component may write to the dead-letter exchange: for a dead letter a component made,
the ``x-casetrail-original-user-id`` it copied, and only when the dead letter's own
``user_id`` is the component that consumes that exchange (the consumer for events,
the worker for commands, the capability worker for tool requests); for one the broker
made (a delivery limit), the original's retained ``user_id``. That publisher must be
one that may publish there. Tool replies, cancels and anything else are never
redriven. So nobody launders a message into another identity through a redrive.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from casetrail.adapters.bus.connection import BusConnection, IncomingMessage, connect
from casetrail.adapters.bus.dead_letter import (
    DEAD_LETTERED_AT_HEADER,
    ORIGINAL_USER_HEADER,
    REASON_HEADER,
)
from casetrail.adapters.bus.dead_letter import held as held_messages
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.config import Component, Settings

REDRIVEN_AT_HEADER = "x-casetrail-redriven-at"
_SET_ASIDE = {REASON_HEADER, DEAD_LETTERED_AT_HEADER, ORIGINAL_USER_HEADER,
              "x-original-exchange",
              "x-original-routing-key", "x-death", "x-first-death-exchange",
              "x-first-death-queue", "x-first-death-reason", "x-last-death-exchange",
              "x-last-death-queue", "x-last-death-reason"}


class NotRedrivable(Exception):
    """A dead letter that is not sent back, and why."""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class DeadLetter:
    """One message set aside, as an operator sees it."""

    message_id: str
    type: str | None
    case_id: str | None
    reason: str
    exchange: str
    routing_key: str
    dead_lettered_at: datetime | None
    redriven_at: str | None
    headers: dict[str, Any]
    body: bytes
    user_id: str | None = None
    """The dead letter's own ``user_id``: who put it on the dead-letter exchange (the
    broker checked it), or, when the broker dead-lettered it, the original's."""
    made_by_broker: bool = False
    """Dead-lettered by the broker (``x-death``), not set aside by a component."""

    @classmethod
    def of(cls, message: IncomingMessage) -> DeadLetter:
        headers: dict[str, Any] = dict(message.headers or {})
        deaths = headers.get("x-death")
        death: dict[str, Any] = dict(deaths[0]) if isinstance(deaths, list) and deaths \
            and isinstance(deaths[0], dict) else {}
        reason = _text(headers.get(REASON_HEADER)) or \
            f"broker: {_text(death.get('reason')) or 'unknown'}"
        exchange = _text(headers.get("x-original-exchange"))
        if exchange is None:
            exchange = _text(death.get("exchange")) or ""
        routing_key = _text(headers.get("x-original-routing-key"))
        if routing_key is None:
            keys = death.get("routing-keys") or [""]
            routing_key = _text(keys[0]) or ""
        at = _text(headers.get(DEAD_LETTERED_AT_HEADER))
        when = datetime.fromisoformat(at) if at else death.get("time")
        return cls(
            message_id=message.message_id or "", type=message.type,
            case_id=message.correlation_id, reason=reason, exchange=exchange,
            routing_key=routing_key,
            dead_lettered_at=when.replace(tzinfo=when.tzinfo or UTC)
            if isinstance(when, datetime) else None,
            redriven_at=_text(headers.get(REDRIVEN_AT_HEADER)), headers=headers,
            body=message.body, user_id=message.user_id,
            made_by_broker=REASON_HEADER not in headers and bool(death))

    def age_seconds(self, now: datetime) -> float | None:
        return None if self.dead_lettered_at is None else \
            (now - self.dead_lettered_at).total_seconds()

    def sender(self, settings: Settings) -> Component:
        """The component to redrive it as: the one that first published it, as the
        broker vouched (see the module); ``NotRedrivable`` with the reason otherwise."""
        topology = Topology(settings.namespace)
        roles: dict[str, tuple[set[Component], set[Component]]] = {
            # exchange: (who may publish there, who consumes and may set it aside)
            topology.events_exchange: ({"worker"}, {"consumer"}),
            topology.commands_exchange: ({"api", "worker"}, {"worker"}),
            topology.capabilities_exchange: ({"worker"}, {"capability"}),
        }
        if self.exchange not in roles:
            raise NotRedrivable(f"a message from {self.exchange or 'the default exchange'} "
                                "(a tool reply, a cancel) is never redriven")
        publishers, handlers = roles[self.exchange]
        if self.made_by_broker:
            first = self.user_id
        else:
            setter = settings.component_of(self.user_id)
            if setter not in handlers:
                raise NotRedrivable(f"set aside by broker user {self.user_id!r}, which does "
                                    f"not consume {self.exchange}: its word on the sender "
                                    "is not taken")
            first = _text(self.headers.get(ORIGINAL_USER_HEADER))
        origin = settings.component_of(first)
        if origin is None or origin not in publishers:
            raise NotRedrivable(f"first published by broker user {first!r}, which may not "
                                f"publish to {self.exchange}")
        return origin

    def headers_to_send(self, now: datetime) -> dict[str, Any]:
        kept = {k: v for k, v in self.headers.items() if k not in _SET_ASIDE}
        return {**kept, REDRIVEN_AT_HEADER: now.isoformat()}


@contextlib.asynccontextmanager
async def held(connection: BusConnection, topology: Topology, limit: int
               ) -> AsyncIterator[list[tuple[IncomingMessage, DeadLetter]]]:
    """Up to ``limit`` dead letters, oldest first, each with what it says, held
    unacknowledged: those not acked inside go back to the queue, in order."""
    async with held_messages(connection, topology, limit) as messages:
        yield [(message, DeadLetter.of(message)) for message in messages]


async def redrive(settings: Settings, admin: BusConnection,
                  wanted: set[str] | None, reason: str | None, *, again: bool,
                  limit: int = 10_000
                  ) -> tuple[list[DeadLetter], list[tuple[DeadLetter, str]]]:
    """Send back the dead letters whose id is in ``wanted`` (``None``: all) and whose
    reason contains ``reason``; returns ``(sent, refused)``, each refused with why (not
    redrivable, or redriven once already and ``again`` not given)."""
    topology = Topology(settings.namespace)
    sent: list[DeadLetter] = []
    refused: list[tuple[DeadLetter, str]] = []
    publishers: dict[Component, tuple[BusConnection, Publisher]] = {}
    try:
        async with held(admin, topology, limit) as letters:
            for message, letter in letters:
                if (wanted is not None and letter.message_id not in wanted) or \
                        (reason is not None and reason not in letter.reason):
                    continue
                if letter.redriven_at is not None and not again:
                    refused.append((letter, "it was redriven once already (--again to send "
                                            "it anyway)"))
                    continue
                try:
                    component = letter.sender(settings)
                except NotRedrivable as exc:
                    refused.append((letter, str(exc)))
                    continue
                if component not in publishers:
                    connection = await connect(settings.identity(component).amqp_url,
                                               f"casetrail-redrive-{component}")
                    publishers[component] = (connection, await Publisher.open(connection))
                now = datetime.now(UTC)
                await publishers[component][1].publish(
                    letter.exchange, letter.routing_key, letter.body,
                    message_id=letter.message_id or None, message_type=letter.type,
                    correlation_id=letter.case_id, headers=letter.headers_to_send(now))
                await message.ack()
                sent.append(letter)
    finally:
        for connection, _ in publishers.values():
            await connection.close()
    return sent, refused


def describe(letter: DeadLetter, now: datetime) -> str:
    age = letter.age_seconds(now)
    shown_age = "?" if age is None else f"{age:,.0f}s"
    return (f"{letter.message_id}  {letter.type or '-':<16} case {letter.case_id or '-'}  "
            f"age {shown_age}  from {letter.exchange or '(default)'}:{letter.routing_key}"
            f"{'  (redriven before)' if letter.redriven_at else ''}\n    {letter.reason}")


async def connect_admin(settings: Settings) -> BusConnection:
    """The operator's (bootstrap) connection: the dead-letter queue is nobody's to read
    but the admin's."""
    return await connect(settings.amqp_url, "casetrail-dead-letters")
