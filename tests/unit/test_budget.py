"""A turn's tool results within one event (service/engine/budget.py), without services:
the largest results give way first, only as many as needed, each to a tool error naming
its size and SHA-256; a turn far from the limit is left as it is."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import orjson

from casetrail.contract.events import MAX_EVENT_BYTES, ToolCallRecord
from casetrail.engine.budget import ENVELOPE_ROOM, within_budget
from casetrail.engine.chat import ToolResultMessage
from casetrail.engine.tools import ToolOutcome


def outcome(call_id: str, result: Any) -> ToolOutcome:
    content = orjson.dumps(result).decode()
    record = ToolCallRecord(tool_name="fetch", tool_args={"id": call_id}, tool_result=result,
                            tool_source="worker", duration=timedelta(milliseconds=5),
                            tool_call_id=call_id)
    return ToolOutcome(record, ToolResultMessage(call_id, "fetch", content))


def test_a_small_turn_is_left_as_it_is() -> None:
    turn = [outcome("a", {"score": 742}), outcome("b", {"text": "x" * 200_000})]
    assert within_budget(turn, MAX_EVENT_BYTES, "reasoning") == turn


def test_the_largest_results_give_way_until_the_rest_fit() -> None:
    big, bigger, small = ({"text": "x" * 600_000}, {"text": "y" * 700_000},
                          {"text": "é" * 1000})
    kept = within_budget([outcome("a", big), outcome("b", bigger), outcome("c", small)],
                         MAX_EVENT_BYTES, "I fetch three documents.")
    assert kept[0].record.tool_result == big and kept[2].record.tool_result == small
    dropped = kept[1]
    data = orjson.dumps(bigger)
    assert dropped.record.tool_result is None and dropped.observation.is_error
    assert f"{len(data):,} bytes" in (dropped.record.error or "")
    assert hashlib.sha256(data).hexdigest() in (dropped.record.error or "")
    assert dropped.observation.content == f"ERROR: {dropped.record.error}"
    assert dropped.record.tool_call_id == "b" and dropped.record.tool_args == {"id": "b"}
    total = sum(len(o.observation.content.encode()) for o in kept)
    assert total <= MAX_EVENT_BYTES - ENVELOPE_ROOM


def test_multi_byte_text_is_counted_in_bytes() -> None:
    """300,000 four-byte characters are 1.2 MB: over, though the characters are few."""
    kept = within_budget([outcome("a", {"text": "😀" * 300_000})], MAX_EVENT_BYTES, "")
    assert kept[0].record.error is not None and "bytes of JSON" in kept[0].record.error
