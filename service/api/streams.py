"""Server-Sent Events of a case's trail and of a tenant's events.

A case's stream (``GET /cases/{id}/stream``) is the stored trail followed by the live
events, with neither a gap nor a duplicate at the seam:

1. it starts watching the case on the bus (``EventWatch.watch``) *before* reading
   the stored trail, so an event published after the read is in the live feed;
2. it sends the stored events after ``Last-Event-ID`` (``<attempt>.<seq>``);
3. it sends each live event after the last one sent, dropping what it already sent.
   A live event that does not directly follow the last one sent (an event published
   just before the watch began, still on its way to Postgres; one missed while the
   broker connection was down; a new attempt) makes it read the record for what lies
   between, waiting up to ``GAP_WAIT_SECONDS`` for the consumer to store it. Such an
   event with nothing after it to reveal the gap (the terminal one, or the last before
   a long model call) is found the same way: while the watch is younger than
   ``GAP_WAIT_SECONDS`` and no live event has directly followed what was sent, a
   quiet feed sends the stream back to the record, less often each time (``_Seam``);
4. it ends after the terminal event; a comment line keeps it alive meanwhile.

Each event goes out as ``id: <attempt>.<seq>``, ``event: <EVENT_TYPE>``, ``data:``
the envelope (as ``GET /cases/{id}/events`` shows it; a live event's ``recordedAt``
is null). Callers with ``pii:read`` see sensitive values restored, like the REST view.

The tenant stream (``GET /events/stream``) is live only, for dashboards: every event
of the caller's tenant as it is published, placeholders kept (values are per case).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi.sse import format_sse_event
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from casetrail.adapters.bus.watch import EventWatch, LiveEvent, Watcher, case_key, tenant_key
from casetrail.adapters.store import CaseStore
from casetrail.contract.events import TERMINAL_EVENT_TYPES
from casetrail.privacy.sensitive import restore

log = logging.getLogger("casetrail.api")

GAP_WAIT_SECONDS = 5.0
STREAMS_CLOSE_SECONDS = 5
"""How long a stopping API lets open streams run before it closes them (a case
waiting for a person keeps its stream open indefinitely)."""
"""How long a stream waits for the record to fill a gap before it goes on without it
(an event the consumer refused is never stored)."""

GAP_FIRST_PAUSE_SECONDS = 0.02
GAP_MAX_PAUSE_SECONDS = 0.5

Key = tuple[int, int]
"""``(attempt, seq)``: the order of a case's events."""


@dataclass(frozen=True)
class StreamStart:
    """A case stream, checked before its response starts: the case, where to resume,
    and the values to restore (empty without ``pii:read``)."""

    case_id: uuid.UUID
    after: Key | None
    ended: bool
    """The case had ended when the request came (its terminal event is stored)."""
    values: dict[str, str]


def parse_event_id(text: str) -> Key:
    """``<attempt>.<seq>`` (``ValueError`` otherwise)."""
    attempt, dot, seq = text.partition(".")
    if not dot or not attempt.isdigit() or not seq.isdigit() or int(attempt) < 1:
        raise ValueError("Last-Event-ID must be <attempt>.<seq>, as the stream sent it")
    return int(attempt), int(seq)


def _follows(last: Key | None, key: Key) -> bool:
    """Whether ``key`` comes directly after ``last`` within one attempt."""
    return key == (1, 0) if last is None else key == (last[0], last[1] + 1)


@dataclass(frozen=True, slots=True)
class Frame:
    """One message of a stream: an event (its type, its envelope as JSON, its id), or a
    keep-alive (``event`` None). Not a validated model: its type is one of the
    contract's and its id a key or an event id (``casetrail.adapters.bus.watch`` lets no
    other through), so nothing in it can break a line of the stream."""

    event: str | None
    data: str = ""
    id: str | None = None

    def written(self) -> bytes:
        """The frame as ``text/event-stream`` bytes."""
        if self.event is None:
            return _PING
        return format_sse_event(data_str=self.data, event=self.event, id=self.id)


PING = Frame(None)
_PING = format_sse_event(comment="ping")


def _message(key: Key, event_type: str, envelope: dict[str, Any],
             values: dict[str, str]) -> Frame:
    shown = restore(envelope, values) if values else envelope
    return Frame(event_type, orjson.dumps(shown).decode(), f"{key[0]}.{key[1]}")


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response whose body is closed when the response ends,
    however it ends (a client gone, the server stopping): the stream's slot and its
    watch are given back then, not when the garbage collector gets to it. (Not
    FastAPI's ``EventSourceResponse``: a route declaring that has its events passed
    through FastAPI's own tasks; see ``event_stream``.)"""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncGenerator[bytes, None]) -> None:
        super().__init__(body, headers={"Cache-Control": "no-cache",
                                        "X-Accel-Buffering": "no"})  # no proxy buffering
        self._body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._body.aclose()


def event_stream(ticket: StreamTicket, messages: AsyncGenerator[Frame, None]
                 ) -> EventStream:
    """``messages`` as a ``text/event-stream`` response, each written as it comes. When
    it ends or is cancelled, ``messages`` is closed, then the stream's slot (``ticket``)
    given back: in order, not left to the garbage collector, which would close the
    inner generators out of order.

    Written here rather than by FastAPI's generator routes, which pass each event
    through two more tasks and a keep-alive timer of their own (these streams send
    their own keep-alives): one step of the event loop an event instead of four, so
    that hundreds of open streams leave the API's other requests their turn. Each
    message is a plain ``Frame``, not a model validated for each event of each stream."""

    async def written() -> AsyncGenerator[bytes, None]:
        with ticket:
            async with aclosing(messages):
                async for message in messages:
                    yield message.written()
    return EventStream(written())


CREDENTIAL_RECHECK_SECONDS = 15.0
"""A stream asks whether its credential still works at least this often, whatever it
sends meanwhile (a busy stream must not outlive a revoked key)."""


class TooManyStreams(Exception):
    """The caller's key, or its tenant, holds as many open streams as it may."""


@dataclass
class StreamSlots:
    """Open streams counted per credential and per tenant, each with its limit (an
    open stream holds a bus binding and a connection: none is free)."""

    per_key: int
    per_tenant: int
    _open: Counter[str] = field(default_factory=Counter)

    def take(self, subject: str, tenant: str) -> StreamTicket:
        """A slot for one stream; ``TooManyStreams`` when either limit is reached."""
        holders = (f"key:{subject}", f"tenant:{tenant}")
        if self._open[holders[0]] >= self.per_key:
            raise TooManyStreams(f"this credential has {self.per_key} streams open, its "
                                 "limit; close one first")
        if self._open[holders[1]] >= self.per_tenant:
            raise TooManyStreams(f"tenant {tenant!r} has {self.per_tenant} streams open, its "
                                 "limit; close one first")
        self._open.update(holders)
        return StreamTicket(self, holders)


class StreamTicket:
    """One stream's slot; released when the stream ends (or, for a stream whose body
    never ran, when the ticket is collected)."""

    def __init__(self, slots: StreamSlots, holders: tuple[str, str]) -> None:
        self._release = weakref.finalize(self, _give_back, slots._open, holders)

    def release(self) -> None:
        self._release()

    def __enter__(self) -> StreamTicket:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def _give_back(counts: Counter[str], holders: tuple[str, str]) -> None:
    counts.subtract(holders)
    for holder in holders:
        if counts[holder] <= 0:
            del counts[holder]


@dataclass
class _Seam:
    """A young case stream's doubt: an event published just before its watch began may
    still be on its way to the record, with nothing after it on the live feed to reveal
    it. While in doubt, a quiet feed sends the stream back to the record, after 20 ms,
    then twice as long each time. The doubt ends after ``GAP_WAIT_SECONDS``, or at once
    when a live event directly follows what was sent: everything before that event is
    sent, and everything after it was published after the watch began."""

    until: float
    pause: float = GAP_FIRST_PAUSE_SECONDS

    def doubts(self, now: float) -> bool:
        return now < self.until

    def settle(self) -> None:
        self.until = 0.0


async def _live(watcher: Watcher, ping_seconds: float,
                still_allowed: Callable[[], Awaitable[bool]], what: str,
                seam: _Seam | None = None,
                ) -> AsyncGenerator[LiveEvent | Frame | None, None]:
    """The watcher's live events, with a keep-alive (``PING``) after ``ping_seconds``
    without one; it ends when the credential no longer works (asked at least every
    ``CREDENTIAL_RECHECK_SECONDS``, events or not) or the watcher fell behind. Besides,
    while ``seam`` doubts, a quiet spell yields ``None``: the caller looks at the record."""
    recheck_seconds = min(ping_seconds, CREDENTIAL_RECHECK_SECONDS)
    now = time.monotonic()
    ping_at, check_at = now + ping_seconds, now + recheck_seconds
    while True:
        now = time.monotonic()
        if now >= check_at:
            if not await still_allowed():
                return
            check_at = time.monotonic() + recheck_seconds
        doubting = seam if seam is not None and seam.doubts(now) else None
        due = min(ping_at, check_at) - now
        wait = due if doubting is None else min(doubting.pause, due)
        try:
            # A timeout scope, not wait_for: no task made for each event.
            async with asyncio.timeout(max(wait, 0.0)):
                live = await watcher.events.get()
        except TimeoutError:
            if time.monotonic() >= ping_at:
                ping_at = time.monotonic() + ping_seconds
                yield PING
            elif doubting is not None:
                doubting.pause *= 2
                yield None
            continue
        ping_at = time.monotonic() + ping_seconds
        if watcher.cut_off:
            log.warning("stream of %s fell behind and was ended", what)
            return
        yield live


@dataclass
class _Sent:
    """What a case's stream has sent: the last event's key, and whether that ended it."""

    store: CaseStore
    case_id: uuid.UUID
    values: dict[str, str]
    last: Key | None
    ended: bool = False

    async def recorded(self, before: Key | None) -> list[Frame]:
        """The stored events after ``last`` (and before ``before``), up to a terminal one."""
        sent = []
        for e in await self.store.events_between(self.case_id, self.last, before):
            self.last = (e.attempt, e.seq)
            sent.append(_message(self.last, e.event_type, e.as_json(), self.values))
            if e.event_type in TERMINAL_EVENT_TYPES:
                self.ended = True
                break
        return sent


async def _gap(sent: _Sent, before: Key) -> AsyncGenerator[Frame, None]:
    """The stored events a live one does not follow yet: read again, backing off, until
    the gap closes (the consumer lagged) or ``GAP_WAIT_SECONDS`` pass."""
    waited_until = time.monotonic() + GAP_WAIT_SECONDS
    pause = GAP_FIRST_PAUSE_SECONDS
    while True:
        for message in await sent.recorded(before):
            yield message
        if sent.ended:
            return
        # Within an attempt seqs have no holes; a new attempt's start, read once.
        if _follows(sent.last, before) or before[1] == 0 or time.monotonic() > waited_until:
            break
        # Backing off: a consumer that lags under load is not helped by hundreds of
        # streams asking Postgres twenty times a second.
        await asyncio.sleep(pause)
        pause = min(pause * 2, GAP_MAX_PAUSE_SECONDS)
    if not _follows(sent.last, before) and before[1] != 0:
        log.warning("stream of case %s: events before %s.%s not in the record",
                    sent.case_id, *before)


async def case_stream(watch: EventWatch, store: CaseStore, case_id: uuid.UUID,
                      after: Key | None, ended: bool, values: dict[str, str],
                      ping_seconds: float,
                      still_allowed: Callable[[], Awaitable[bool]]
                      ) -> AsyncGenerator[Frame, None]:
    """The case's events after ``after``: stored, then live (see the module). ``ended``:
    the case had ended when the request came.
    ``still_allowed`` is asked at each keep-alive, so a revoked key's stream ends."""
    sent = _Sent(store, case_id, values, after)
    async with watch.watch(case_key(case_id)) as watcher:
        for message in await sent.recorded(None):
            yield message
        if sent.ended or ended:  # or it had ended before: resumed after its terminal event
            return
        seam = _Seam(time.monotonic() + GAP_WAIT_SECONDS)
        async for live in _live(watcher, ping_seconds, still_allowed, f"case {case_id}", seam):
            if live is None:  # quiet while the watch is young: anything stored meanwhile
                for message in await sent.recorded(None):
                    yield message
                if sent.ended:
                    return
                continue
            if isinstance(live, Frame):  # a keep-alive
                yield live
                continue
            if sent.last is not None and live.key <= sent.last:
                continue  # sent already, from the record
            if not _follows(sent.last, live.key):
                async for message in _gap(sent, live.key):
                    yield message
                if sent.ended:
                    return
            if _follows(sent.last, live.key):
                seam.settle()
            yield _message(live.key, live.event_type, live.envelope, values)
            sent.last = live.key
            if live.event_type in TERMINAL_EVENT_TYPES:
                return


async def tenant_stream(watch: EventWatch, tenant: str, ping_seconds: float,
                        still_allowed: Callable[[], Awaitable[bool]]
                        ) -> AsyncGenerator[Frame, None]:
    """Every event of ``tenant`` as it is published (live only; ``id`` is the event
    id). ``still_allowed`` is asked at each keep-alive, so a revoked key's stream ends."""
    async with watch.watch(tenant_key(tenant)) as watcher:
        async for live in _live(watcher, ping_seconds, still_allowed, f"tenant {tenant}"):
            if not isinstance(live, LiveEvent):  # a keep-alive (no seam: live only)
                if live is not None:
                    yield live
                continue
            yield Frame(live.event_type, orjson.dumps(live.envelope).decode(),
                        live.envelope["eventId"])
