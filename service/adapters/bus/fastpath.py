"""The AMQP fast path: confirmed publishes and deliveries below aiormq's public API.

This is the one module in casetrail that touches aiormq's private members. It is
off until a component switches it on with :func:`enable` (the worker, the consumer
and the API do, unless ``CASETRAIL_AMQP_FASTPATH=off``); importing it changes
nothing. It never replaces anything at module level: each piece is installed on one
channel that casetrail opened itself, so other aio-pika connections in the same
process are untouched.

What it does, and why (figures in docs/benchmarks.md):

- :class:`ConfirmedChannel` publishes below ``basic_publish``. That method holds the
  channel's lock until the connection's writer task has written and drained the
  frames, so concurrent publishes queue behind one another at several task switches
  each; and aiormq settles a ``multiple`` ack by walking every unconfirmed publish and
  scheduling a callback for each one, which dominated the worker's CPU with
  thousands of cases in flight. Here the frames are encoded once
  (``casetrail.adapters.bus.frames``), the publishes of one event-loop turn leave in one
  write, and an ack settles the
  publishes it covers from the front of the (tag-ordered) confirmations.
- :func:`deliver_in_line` hands each delivery to a subscription's handler from the
  channel's reader, where aiormq would start a task for each message.

It was written against the aiormq and pamqp versions in :data:`WRITTEN_FOR` and checks
them, and the members it uses, before it switches on. On any other version it logs
one warning and the components use the public path (``aiormq.Channel.basic_publish``
and ``basic_consume``), which the test suite runs too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any, TypeVar

import aiormq
from aiormq.abc import ChannelFrame, DeliveredMessage, TaskType
from aiormq.channel import Returning
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from casetrail.adapters.bus.frames import publish_frames
from casetrail.adapters.bus.properties import Properties

log = logging.getLogger("casetrail.bus")

D = TypeVar("D")
"""What a delivery is wrapped in (deliveries.py's ``Delivery``): this module knows only
aiormq's message, so the wrapper's module can import this one and not the other way."""

WRITTEN_FOR: Mapping[str, tuple[str, ...]] = {
    "aiormq": ("7.2.",),
    "pamqp": ("3.3.", "4.0."),
}
"""Version prefixes of the libraries whose internals this module was written against."""

_CHANNEL_METHODS = (
    "_on_confirm_frame", "_on_close_frame", "_on_deliver_frame", "_get_frame",
    "_read_content", "create_future", "create_task",
)
"""The channel methods used here; a version without one of them gets the public path.
(The attributes it uses - ``confirmations``, ``delivery_tag``,
``message_id_delivery_tag``, ``write_queue``, ``max_content_size`` - are set per
instance; the version check stands for them, and the tests exercise each.)"""

_enabled = False


def installed_versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in WRITTEN_FOR}


def unsupported(versions: Mapping[str, str]) -> list[str]:
    """What stands in the way of the fast path with these library versions (empty: none)."""
    problems = [
        f"{name} {versions.get(name, '(missing)')} "
        f"(written for {' or '.join(p + 'x' for p in prefixes)})"
        for name, prefixes in WRITTEN_FOR.items()
        if not versions.get(name, "").startswith(prefixes)
    ]
    missing = [m for m in _CHANNEL_METHODS if not callable(getattr(aiormq.Channel, m, None))]
    if missing:
        problems.append(f"aiormq.Channel lacks {', '.join(missing)}")
    return problems


def enable(wanted: bool = True, versions: Mapping[str, str] | None = None) -> bool:
    """Switch the fast path on for the publishers and subscriptions this process
    creates from now on, if ``wanted`` and the installed libraries are the ones it
    was written for; otherwise log why (once) and keep the public path."""
    global _enabled  # noqa: PLW0603 - one switch per process, set by its component
    if not wanted:
        _enabled = False
        log.info("AMQP fast path off (CASETRAIL_AMQP_FASTPATH=off): public aiormq API only")
        return False
    problems = unsupported(installed_versions() if versions is None else versions)
    if problems:
        _enabled = False
        log.warning("AMQP fast path not used, public aiormq API instead: %s",
                    "; ".join(problems))
        return False
    _enabled = True
    return True


def disable() -> None:
    global _enabled  # noqa: PLW0603
    _enabled = False


def enabled() -> bool:
    """Whether publishers and subscriptions created now take the fast path."""
    return _enabled


def _aiormq_channel(channel: object) -> aiormq.Channel:
    if not isinstance(channel, aiormq.Channel):
        raise TypeError(f"needs an aiormq channel, not {type(channel).__name__}")
    return channel


class ConfirmedChannel:
    """Confirmed publishes on one aiormq channel, below ``basic_publish`` (see the module).

    A publish registers its confirm in the channel's own books as ``basic_publish``
    does (the delivery tag, a confirmation future from the channel's future store,
    which fails it when the channel closes, and the message id its return handling
    looks up), and its frames go to a buffer that reaches the connection's writer
    once per event-loop turn, in delivery-tag order.

    Nothing else may publish on the channel: the broker numbers publishes in the
    order it receives them, and the tags here count on that.
    """

    def __init__(self, channel: object) -> None:
        self.channel = raw = _aiormq_channel(channel)
        self._buffer: list[bytes] = []
        self._flush_scheduled = False
        self._slow_put: TaskType | None = None
        self._closed_by_broker = False
        setattr(raw, "_on_confirm_frame", self._on_confirm_frame)  # noqa: B010
        on_close_frame = raw._on_close_frame

        async def closed_by_broker(frame: Any) -> None:
            # From here on the channel's number is the broker's again (aiormq answers
            # Close-Ok at once, before the channel counts as closed): a frame sent on
            # it now would be a connection error, so nothing more leaves.
            self._closed_by_broker = True
            self._buffer.clear()
            await on_close_frame(frame)

        setattr(raw, "_on_close_frame", closed_by_broker)  # noqa: B010

    @property
    def is_closed(self) -> bool:
        return self._closed_by_broker or self.channel.is_closed

    async def _on_confirm_frame(self, frame: Basic.Ack | Basic.Nack) -> None:
        """Settle the publishes an ack or nack covers. Confirmations are entered in
        tag order, so a ``multiple`` one takes them from the front and stops at the
        first later tag. (A return re-enters its tag at the back, as an already
        settled ``Returning`` marker; a later ack clears it.)"""
        confirmations = self.channel.confirmations
        last = frame.delivery_tag
        if frame.multiple:
            tags = []
            for tag in confirmations:
                if tag > last:
                    break
                tags.append(tag)
        else:
            tags = [last]
        for tag in tags:
            confirmation = confirmations.pop(tag, None)
            if confirmation is None or isinstance(confirmation, Returning) \
                    or confirmation.done():  # returned, or its publisher stopped waiting
                continue
            if isinstance(frame, Basic.Ack):
                confirmation.set_result(frame)
            else:
                confirmation.set_exception(aiormq.exceptions.DeliveryError(None, frame))

    def publish(
        self, exchange: str, routing_key: str, body: bytes, properties: Properties
    ) -> asyncio.Future[Any]:
        """Queue one publish; the future resolves on the broker's ack and fails on a
        nack, a return (unroutable) or the channel closing."""
        channel = self.channel
        if self.is_closed:
            raise aiormq.exceptions.ChannelInvalidStateError("publisher channel is closed")
        frames = publish_frames(channel.number, exchange, routing_key, body, properties,
                                max_body_frame=channel.max_content_size)
        channel.delivery_tag += 1
        tag = channel.delivery_tag
        confirmation = channel.create_future()
        channel.confirmations[tag] = confirmation
        returns, message_id = channel.message_id_delivery_tag, properties.message_id
        returns[message_id] = tag

        def forget_message_id(_: object) -> None:
            if returns.get(message_id) == tag:
                del returns[message_id]

        confirmation.add_done_callback(forget_message_id)
        self._buffer.append(frames)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            channel.loop.call_soon(self._flush)
        return confirmation

    def _take(self) -> ChannelFrame:
        frame = ChannelFrame(payload=b"".join(self._buffer), should_close=False)
        self._buffer.clear()
        return frame

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._slow_put is not None or not self._buffer:
            return  # a put waiting for room takes the buffer along when it is done
        if self.is_closed:
            self._buffer.clear()  # their confirmations failed with the channel
            return
        frame = self._take()
        try:
            self.channel.write_queue.put_nowait(frame)
        except asyncio.QueueFull:
            self._slow_put = self.channel.create_task(self._put_waiting(frame))

    async def _put_waiting(self, frame: ChannelFrame) -> None:
        """The connection's write queue is full: wait for room, keeping the order."""
        try:
            while True:
                await self.channel.write_queue.put(frame)
                if not self._buffer or self.is_closed:
                    return
                frame = self._take()
        finally:
            self._slow_put = None
            if self.is_closed:
                self._buffer.clear()


def deliver_in_line(
    channel: object, tag: str, on_delivery: Callable[[D], None],
    wrap: Callable[[aiormq.Channel, DeliveredMessage], D],
) -> None:
    """Deliveries to consumer ``tag`` on ``channel`` reach ``on_delivery`` from the
    channel's reader, each wrapped by ``wrap``.

    This replaces aiormq's ``_on_deliver_frame`` on this one channel (its reader calls
    it by that name) with one that reads the content as aiormq does and then calls
    ``on_delivery`` directly. Deliveries to any other consumer on the channel go the
    usual way.
    """
    raw = _aiormq_channel(channel)
    usual = raw._on_deliver_frame

    async def on_deliver_frame(frame: Basic.Deliver) -> None:
        if frame.consumer_tag != tag:
            await usual(frame)
            return
        header = await raw._get_frame()
        if not isinstance(header, ContentHeader):
            raise ValueError(f"Unexpected frame {header!r} instead of ContentHeader")
        message = await raw._read_content(frame, header)
        try:
            on_delivery(wrap(raw, message))
        except Exception:  # as aiormq does for a failing consumer: log, keep reading
            log.exception("delivery handler failed on %s", tag)

    setattr(raw, "_on_deliver_frame", on_deliver_frame)  # noqa: B010
