"""The buffered frame reader gives exactly the frames pamqp's own decoding gives."""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from datetime import UTC, datetime
from typing import Any

import aiormq.connection
import pamqp.frame
import pytest
from aiormq.connection import ReceivedFrame
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError, ProtocolSyntaxError
from pamqp.base import Frame
from pamqp.body import ContentBody
from pamqp.commands import Basic, Channel, Connection
from pamqp.header import ContentHeader, ProtocolHeader
from pamqp.heartbeat import Heartbeat

import service.bus  # noqa: F401  (installs the reader)
from service.bus.receiver import BufferedFrameReceiver, _content_header, decode_frames

FRAMES: list[tuple[int, Any]] = [
    (1, Basic.Deliver(consumer_tag="ctag-1", delivery_tag=1, redelivered=False,
                      exchange="casetrail.events",
                      routing_key="case.1b4e28ba-2fa1-11d2-883f-0016d3cca427.REACT_CYCLE")),
    (1, ContentHeader(0, 11, Basic.Properties(
        content_type="application/json", delivery_mode=2, message_id="e-1",
        message_type="REACT_CYCLE", headers={"x-casetrail-reason": "bad json: ✗", "n": 3}))),
    (1, ContentBody(b'{"a": "\xc3\xa5"}')),
    (2, Basic.Deliver(consumer_tag="ünï", delivery_tag=2**62 + 5, redelivered=True,
                      exchange="", routing_key="rpc-queue")),
    (2, ContentHeader(0, 0, Basic.Properties())),
    (2, ContentHeader(0, 2**40, Basic.Properties(
        content_type="text/plain", content_encoding="gzip", delivery_mode=1, priority=7,
        correlation_id="c-ü", reply_to="amq.rabbitmq.reply-to", expiration="2500",
        message_id="m-1", message_type="PROBE", user_id="guest", app_id="casetrail"))),
    (2, ContentHeader(0, 5, Basic.Properties(
        message_id="stamped", timestamp=datetime(2026, 11, 30, 2, 0, tzinfo=UTC)))),
    (3, Basic.Ack(delivery_tag=77, multiple=True)),
    (3, Basic.Ack(delivery_tag=78, multiple=False)),
    (3, Basic.Nack(delivery_tag=79, multiple=True, requeue=False)),
    (3, Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="x", routing_key="k")),
    (0, Heartbeat()),
    (4, Basic.ConsumeOk(consumer_tag="amq.ctag-xyz")),
    (4, Channel.Close(reply_code=406, reply_text="PRECONDITION_FAILED", class_id=60,
                      method_id=40)),
    (0, Connection.Blocked(reason="low on memory")),
    (5, ContentBody(bytes(range(256)) * 20)),
]


def wire(frames: list[tuple[int, Any]]) -> bytes:
    return b"".join(pamqp.frame.marshal(frame, channel) for channel, frame in frames)


def same(ours: ReceivedFrame, theirs: ReceivedFrame) -> None:
    assert ours[:2] == theirs[:2]
    assert type(ours[2]) is type(theirs[2])
    assert content(ours[2]) == content(theirs[2])


def content(frame: object) -> object:
    if isinstance(frame, ContentBody):
        return frame.value
    if isinstance(frame, ContentHeader):
        return frame.body_size, dict(frame.properties)
    if isinstance(frame, Frame):
        return dict(frame)
    assert isinstance(frame, Heartbeat)
    return None


def pamqp_decoded(data: bytes) -> list[ReceivedFrame]:
    out: list[ReceivedFrame] = []
    while data:
        taken, channel, frame = pamqp.frame.unmarshal(data)
        out.append((taken, channel, frame))
        data = data[8 if isinstance(frame, Heartbeat) else taken:]
    return out


def test_each_frame_decodes_as_pamqp_decodes_it() -> None:
    data = wire(FRAMES)
    frames: deque[ReceivedFrame] = deque()
    assert decode_frames(data, frames) == len(data)
    expected = pamqp_decoded(data)
    assert len(frames) == len(expected) == len(FRAMES)
    for ours, theirs in zip(frames, expected, strict=True):
        same(ours, theirs)


def test_headers_with_plain_properties_skip_pamqp_and_the_others_do_not() -> None:
    def payload(index: int) -> bytes:
        return pamqp.frame.marshal(FRAMES[index][1], 1)[7:-1]

    plain = [i for i, (_, f) in enumerate(FRAMES) if isinstance(f, ContentHeader)
             and f.properties.headers is None and f.properties.timestamp is None]
    assert len(plain) == 2
    assert all(_content_header(payload(i)) is not None for i in plain)
    assert _content_header(payload(1)) is None  # a headers table
    assert _content_header(payload(6)) is None  # a timestamp


def test_an_incomplete_frame_is_left_for_the_next_read() -> None:
    data = wire(FRAMES[:3])
    first = len(wire(FRAMES[:1]))
    for cut in range(len(data) + 1):
        frames: deque[ReceivedFrame] = deque()
        taken = decode_frames(data[:cut], frames)
        whole = [len(wire(FRAMES[:n])) for n in range(4)]
        assert taken == max(w for w in whole if w <= cut)
        assert len(frames) == whole.index(taken)
    assert first < len(data)


def test_a_frame_without_its_end_octet_is_refused() -> None:
    data = bytearray(wire(FRAMES[:1]))
    data[-1] = 0x00
    with pytest.raises(InvalidFrameError, match="0xCE"):
        decode_frames(bytes(data), deque())


@pytest.mark.parametrize("index", [0, 5, 7])  # deliver, plain header, ack
def test_a_truncated_frame_is_refused_as_a_frame_error(index: int) -> None:
    frame = pamqp.frame.marshal(FRAMES[index][1], 1)
    payload = frame[7:-1]
    for cut in range(len(payload)):
        short = struct.pack(">BHI", frame[0], 1, cut) + payload[:cut] + b"\xce"
        with pytest.raises(InvalidFrameError):
            decode_frames(short, deque())


def test_an_unknown_method_is_refused() -> None:
    data = pamqp.frame.marshal(Basic.Ack(delivery_tag=1), 1)
    data = data[:7] + b"\x00\x3c\x00\x63" + data[11:]  # basic method 99 does not exist
    with pytest.raises(InvalidFrameError):
        decode_frames(data, deque())


async def receiver_over(chunks: list[bytes], *, eof: bool = True) -> BufferedFrameReceiver:
    reader = asyncio.StreamReader()
    receiver = BufferedFrameReceiver(reader)

    async def feed() -> None:
        for chunk in chunks:
            reader.feed_data(chunk)
            await asyncio.sleep(0)
        if eof:
            reader.feed_eof()

    asyncio.get_running_loop().create_task(feed())
    await asyncio.sleep(0)
    return receiver


@pytest.mark.parametrize("step", [1, 3, 7, 64, 100_000])
async def test_frames_arrive_whole_however_the_bytes_are_split(step: int) -> None:
    data = wire(FRAMES)
    receiver = await receiver_over([data[i:i + step] for i in range(0, len(data), step)],
                                   eof=False)
    received = [await receiver.get_frame() for _ in FRAMES]
    assert len(received) == len(FRAMES)
    for ours, theirs in zip(received, pamqp_decoded(data), strict=True):
        same(ours, theirs)


async def test_two_readers_at_once_each_get_a_frame_in_order() -> None:
    data = wire(FRAMES[:3])
    receiver = await receiver_over([data[:5], data[5:]], eof=False)
    first, second = await asyncio.gather(receiver.get_frame(), receiver.get_frame())
    assert isinstance(first[2], Basic.Deliver)
    assert isinstance(second[2], ContentHeader)


async def test_the_connection_closed_between_frames_ends_the_frames() -> None:
    data = wire(FRAMES[:3])
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    received = [frame async for frame in BufferedFrameReceiver(reader)]
    assert [type(frame) for _, _, frame in received] == [Basic.Deliver, ContentHeader,
                                                         ContentBody]


async def test_the_connection_closing_mid_frame_is_a_connection_error() -> None:
    data = wire(FRAMES[:1])
    receiver = await receiver_over([data[:-3]])
    with pytest.raises(AMQPConnectionError, match="unexpectedly closed"):
        await receiver.get_frame()


async def test_a_protocol_header_in_reply_is_refused() -> None:
    receiver = await receiver_over([ProtocolHeader(0, 10, 0).marshal()])
    with pytest.raises(ProtocolSyntaxError):
        await receiver.get_frame()


def test_every_aiormq_connection_reads_with_it() -> None:
    assert aiormq.connection.FrameReceiver is BufferedFrameReceiver
