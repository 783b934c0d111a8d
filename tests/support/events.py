"""Events built by hand (signed by the caller): a start, a cycle, a completion."""

from __future__ import annotations

import uuid
from datetime import timedelta

from casetrail.contract.events import (
    CaseCompletedPayload,
    CaseStartedPayload,
    Event,
    Limits,
    ModelRef,
    ReactCyclePayload,
    TokenUsage,
    ToolCallRecord,
    make_event,
)

USAGE = TokenUsage(input_tokens=100, output_tokens=10)


def started(case_id: uuid.UUID, attempt: int = 1) -> Event:
    return make_event(case_id, attempt, 0, CaseStartedPayload(
        agent="loan-officer", agent_version="1.0.0", casetrail_version="test",
        model=ModelRef(provider="scripted", name="s"),
        system_prompt_digest="ab" * 32, tools_offered=(),
        limits=Limits(max_cycles=3, deadline_seconds=10), input={"applicantId": "A-1001"},
    ))


def cycle(case_id: uuid.UUID, seq: int, index: int, attempt: int = 1, calls: int = 2) -> Event:
    records = tuple(
        ToolCallRecord(
            tool_name=f"tool-{i}", tool_args={"i": i}, tool_result={"ok": i},
            tool_source="worker" if i % 2 == 0 else "local",
            duration=timedelta(milliseconds=10 + i), tool_call_id=f"c{i}",
        )
        for i in range(calls)
    )
    return make_event(case_id, attempt, seq, ReactCyclePayload(
        cycle_index=index, reasoning_text=f"thinking {index}", tool_calls=records,
        token_usage=USAGE,
    ))


def completed(case_id: uuid.UUID, seq: int, cycles: int = 1) -> Event:
    return make_event(case_id, 1, seq, CaseCompletedPayload(
        cycles_completed=cycles, token_totals=USAGE, answer={"decision": "approve"},
    ))
