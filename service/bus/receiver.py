"""Reading AMQP frames off the socket a buffer at a time, for every aiormq connection.

aiormq reads each frame with three awaited ``readexactly`` calls, under a lock, into
a fresh ``BytesIO``, and then hands a copy to pamqp, which checks it for a protocol
header, slices it again and decodes it field by field. A consumer taking ten
thousand events a second receives thirty thousand frames a second, and that was a
sixth of its CPU. Here one ``read`` takes whatever the socket has buffered and
every complete frame in it is decoded before the next read. The frames that come
by the thousand (``basic.deliver``, ``basic.ack``, content headers with plain
properties, and content bodies) are decoded directly; every other frame still goes
through pamqp, and each comes out as the same pamqp object aiormq's own reader
would give.

aiormq builds its reader inside ``Connection.connect`` from the module's
``FrameReceiver`` name, so :func:`install` puts this class under that name. The
package imports this module and calls it, so every connection casetrail opens uses
it. aiormq is pinned (``>=7.2.4,<7.3``) and ``tests/test_receiver.py`` checks the
decoding against pamqp's, frame by frame and split at every byte.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque

import aiormq.connection
import pamqp.frame
from aiormq.connection import ReceivedFrame
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError, ProtocolSyntaxError
from pamqp.base import Frame
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.exceptions import PAMQPException
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from service.bus.frames import (
    BASIC,
    BODY,
    FRAME_END,
    FRAME_HEAD,
    HEADER,
    HEADER_HEAD,
    HEARTBEAT,
    METHOD,
)

_HEAD_SIZE = FRAME_HEAD.size
_FRAME_END = FRAME_END[0]
_DELIVER = struct.pack(">HH", BASIC, 60)
_ACK = struct.pack(">HH", BASIC, 80)
_TAG_AND_BITS = struct.Struct(">qB")  # signed, as pamqp reads a long-long
_READ_SIZE = 256 * 1024
_OCTET, _SHORT_STR = "octet", "shortstr"
# Basic properties in wire order with their flag bits, as pamqp lists them. A header
# with a table (headers), a timestamp or a second flag word goes to pamqp instead.
_PROPERTIES = tuple(
    (flag, name, Basic.Properties.amqp_type(name))
    for name, flag in Basic.Properties.flags.items()
    if Basic.Properties.amqp_type(name) in (_OCTET, _SHORT_STR)
)
_DECODED_ELSEWHERE = 0x0001 | sum(
    flag for name, flag in Basic.Properties.flags.items()
    if Basic.Properties.amqp_type(name) not in (_OCTET, _SHORT_STR)
)


def _short_str(payload: bytes, at: int) -> tuple[str, int]:
    end = at + 1 + payload[at]
    if end > len(payload):
        raise InvalidFrameError("short string runs past the end of its frame")
    return payload[at + 1:end].decode(), end


def _deliver(payload: bytes) -> Basic.Deliver:
    consumer_tag, at = _short_str(payload, 4)
    delivery_tag, bits = _TAG_AND_BITS.unpack_from(payload, at)
    exchange, at = _short_str(payload, at + _TAG_AND_BITS.size)
    routing_key, at = _short_str(payload, at)
    return Basic.Deliver(consumer_tag=consumer_tag, delivery_tag=delivery_tag,
                         redelivered=bool(bits & 1), exchange=exchange,
                         routing_key=routing_key)


def _ack(payload: bytes) -> Basic.Ack:
    delivery_tag, bits = _TAG_AND_BITS.unpack_from(payload, 4)
    return Basic.Ack(delivery_tag=delivery_tag, multiple=bool(bits & 1))


def _content_header(payload: bytes) -> ContentHeader | None:
    """The header as pamqp decodes it (defaults, then each flagged property in
    turn), or ``None`` when it carries a property decoded only by pamqp."""
    class_id, weight, body_size, flags = HEADER_HEAD.unpack_from(payload)
    if flags & _DECODED_ELSEWHERE:
        return None
    properties = Basic.Properties()
    at = HEADER_HEAD.size
    for flag, name, kind in _PROPERTIES:
        if flags & flag:
            value: int | str
            if kind == _OCTET:
                value, at = payload[at], at + 1
            else:
                value, at = _short_str(payload, at)
            setattr(properties, name, value)
    header = ContentHeader(weight, body_size, properties)
    header.class_id = class_id
    return header


def decode_frames(data: bytes, frames: deque[ReceivedFrame]) -> int:
    """Decode every complete frame at the start of ``data`` onto ``frames``, each as
    pamqp's ``unmarshal`` gives it: ``(bytes taken, channel, frame)``. Returns how
    many bytes were taken; the rest is the start of a frame still arriving."""
    at, size = 0, len(data)
    while size - at >= _HEAD_SIZE:
        kind, channel, length = FRAME_HEAD.unpack_from(data, at)
        end = at + _HEAD_SIZE + length
        if end >= size:
            break  # the frame's end octet has not arrived yet
        if data[end] != _FRAME_END:
            raise InvalidFrameError(f"frame on channel {channel} does not end with 0xCE")
        payload = data[at + _HEAD_SIZE:end]
        frame: Frame | ContentBody | Heartbeat | pamqp.frame.FrameTypes
        try:
            if kind == BODY:
                frame = ContentBody(payload)
            elif kind == METHOD and payload[:4] == _DELIVER:
                frame = _deliver(payload)
            elif kind == METHOD and payload[:4] == _ACK:
                frame = _ack(payload)
            elif kind == HEADER and (header := _content_header(payload)) is not None:
                frame = header
            else:
                frame = pamqp.frame.unmarshal(data[at:end + 1])[2]
        except (PAMQPException, struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
            raise InvalidFrameError(str(exc)) from exc
        # pamqp counts a heartbeat as 8 bytes taken; aiormq only passes the count on.
        frames.append((8 if kind == HEARTBEAT else end + 1 - at, channel, frame))
        at = end + 1
    return at


class BufferedFrameReceiver(aiormq.connection.FrameReceiver):
    """aiormq's ``FrameReceiver``, reading a buffer at a time (see the module)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        super().__init__(reader)
        self._pending = b""
        self._frames: deque[ReceivedFrame] = deque()

    async def get_frame(self) -> ReceivedFrame:
        frames = self._frames
        if frames:
            return frames.popleft()
        if self.reader.at_eof() and not self._pending:
            raise StopAsyncIteration
        async with self.lock:  # a second caller waits here, then finds frames
            while not frames:
                await self._read_more()
        return frames.popleft()

    async def _read_more(self) -> None:
        try:
            chunk = await self.reader.read(_READ_SIZE)
        except ConnectionRefusedError as exc:
            raise AMQPConnectionError(f"Server connection refused: {exc!r}") from exc
        except ConnectionResetError as exc:
            raise AMQPConnectionError(f"Server connection reset: {exc!r}") from exc
        except OSError as exc:
            raise AMQPConnectionError(f"Server communication error: {exc!r}") from exc
        if not chunk:
            raise AMQPConnectionError(
                "Server connection unexpectedly closed with "
                f"{len(self._pending)} bytes of a frame read")
        data = self._pending + chunk if self._pending else chunk
        if not self.started and len(data) >= 4:
            if data[:4] == b"AMQP":
                raise ProtocolSyntaxError("Unexpected AMQP protocol header")
            self.started = True
        taken = decode_frames(data, self._frames)
        self._pending = data[taken:]


def install() -> None:
    """Make :class:`BufferedFrameReceiver` the reader of every aiormq connection
    opened from now on in this process."""
    aiormq.connection.FrameReceiver = BufferedFrameReceiver  # type: ignore[misc]
