"""The publish frames casetrail writes itself are byte for byte what pamqp writes."""

from __future__ import annotations

from typing import Any

import pamqp.frame
import pytest
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from casetrail.adapters.bus.frames import FRAME_OVERHEAD, publish_frames
from casetrail.adapters.bus.properties import Properties

FRAME_MAX = 131_072


def pamqp_frames(channel: int, exchange: str, key: str, body: bytes, props: Properties,
                 mandatory: bool, max_body_frame: int) -> bytes:
    properties = props.to_basic()
    frames: list[Any] = [
        Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory),
        ContentHeader(0, len(body), properties),
    ]
    frames += [ContentBody(body[i:i + max_body_frame])
               for i in range(0, len(body), max_body_frame)]
    return b"".join(pamqp.frame.marshal(f, channel) for f in frames)


CASES = [
    ("events", "case.default.1b4e28ba-2fa1-11d2-883f-0016d3cca427.REACT_CYCLE",
     b'{"a":1}' * 100,
     Properties(message_id="e1", message_type="REACT_CYCLE", correlation_id="c1",
                user_id="casetrail-worker",
                headers={"x-casetrail-integrity": {"prevHash": "0" * 64, "hash": "a" * 64,
                                                   "keyId": "b" * 16, "sig": "c" * 86}})),
    ("", "rpc-queue", b"", Properties(message_id="m", reply_to="amq.rabbitmq.reply-to",
                                       correlation_id="7", expiration_ms=2500)),
    ("dead", "", "åäö ✓".encode(), Properties(
        message_id="ünïcode", persistent=False,
        headers={"x-casetrail-reason": "bad json: ✗", "x-count": 3,
                 "nested": {"list": [1, "two", True]}})),
    ("x", "k", b"z", Properties(message_id="only", content_type="text/plain",
                                 correlation_id="", message_type="", headers={})),
]


@pytest.mark.parametrize(("exchange", "key", "body", "props"), CASES)
@pytest.mark.parametrize("mandatory", [True, False])
def test_publish_frames_match_pamqp(exchange: str, key: str, body: bytes,
                                    props: Properties, mandatory: bool) -> None:
    ours = publish_frames(3, exchange, key, body, props, max_body_frame=FRAME_MAX - 8,
                          mandatory=mandatory)
    assert ours == pamqp_frames(3, exchange, key, body, props, mandatory, FRAME_MAX - 8)


def test_a_large_body_is_split_at_the_frame_size() -> None:
    body = bytes(range(256)) * 40  # 10,240 bytes
    props = Properties(message_id="big")
    ours = publish_frames(1, "events", "k", body, props, max_body_frame=4096 - FRAME_OVERHEAD)
    assert ours == pamqp_frames(1, "events", "k", body, props, True, 4096 - FRAME_OVERHEAD)
    # method, header, then 3 body frames, each within the negotiated frame size
    offset, sizes = 0, []
    while offset < len(ours):
        size, _, frame = pamqp.frame.unmarshal(ours[offset:])
        sizes.append((type(frame).__name__, size))
        offset += size
    assert [name for name, _ in sizes] == ["Publish", "ContentHeader", "ContentBody",
                                           "ContentBody", "ContentBody"]
    assert all(size <= 4096 for _, size in sizes)


def test_a_name_over_255_bytes_is_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match="routing_key is 256 bytes"):
        publish_frames(1, "events", "k" * 256, b"", Properties(message_id="m"),
                       max_body_frame=FRAME_MAX)
    with pytest.raises(ValueError, match="message_id is 300 bytes"):
        publish_frames(1, "events", "k", b"", Properties(message_id="é" * 150),
                       max_body_frame=FRAME_MAX)
