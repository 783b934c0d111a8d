"""The event contract: byte-level JSON form, the timedelta trap, strict rejection."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from casetrail.contract.events import (
    EVENT_ID_NAMESPACE,
    CaseCompletedPayload,
    InvalidEvent,
    ReactCyclePayload,
    TokenUsage,
    ToolCallRecord,
    event_from_json,
    event_id_for,
    make_event,
)
from tests.support import ROOT
from tests.support.properties import examples

SEED_CYCLE = (
    b'{"cycleIndex":2,"reasoningText":"The credit score is 720. I should now retrieve the risk '
    b'model...","toolCalls":[{"toolName":"risk-model-retrieval","toolArgs":{"modelId":'
    b'"standard-v2"},"toolResult":{"risk":"low","score":0.12},"toolSource":"worker",'
    b'"durationMs":1450}],"tokenUsage":{"inputTokens":1240,"outputTokens":89}}'
)
CASE = uuid.UUID("0b6f8a8e-4f0e-4c7a-9d0e-5f3c1b2a9d10")


def test_seed_react_cycle_round_trips_byte_for_byte() -> None:
    payload = ReactCyclePayload.model_validate(orjson.loads(SEED_CYCLE))
    assert payload.tool_calls[0].duration == timedelta(milliseconds=1450)
    assert orjson.dumps(payload.model_dump(mode="json", by_alias=True)) == SEED_CYCLE


def test_envelope_is_exact_and_event_id_is_deterministic() -> None:
    payload = ReactCyclePayload.model_validate(orjson.loads(SEED_CYCLE))
    at = datetime(2026, 11, 29, 19, 49, 19, 123456, tzinfo=UTC)
    event = make_event(CASE, 1, 3, payload, occurred_at=at)
    body = event.to_json()
    wire = orjson.loads(body)
    # RFC 8785: keys sorted, no whitespace; the body is exactly the canonical form.
    assert list(wire) == [
        "attempt", "caseId", "eventId", "eventType", "occurredAt", "payload", "schemaVersion",
        "seq", "tenantId",
    ]
    assert body.startswith(b'{"attempt":1,"caseId":"0b6f8a8e-4f0e-4c7a-9d0e-5f3c1b2a9d10",')
    assert b" " not in body.replace(b"The credit score is 720. I should now retrieve the "
                                    b"risk model...", b"")
    assert wire["eventId"] == str(event_id_for(CASE, 1, 3))
    assert wire["occurredAt"] == "2026-11-29T19:49:19.123456Z"
    assert wire["eventType"] == "REACT_CYCLE"
    assert wire["schemaVersion"] == 2
    assert wire["tenantId"] == "default"
    assert event_id_for(CASE, 1, 3) == event_id_for(CASE, 1, 3) != event_id_for(CASE, 2, 3)
    assert event_from_json(event.to_json()) == event


def test_an_events_wire_values_are_made_once_and_belong_to_it() -> None:
    """The sink signs the wire values and the checks read the same ones: made once. A
    copy with other fields has values of its own; equality ignores what was made."""
    payload = ReactCyclePayload.model_validate(orjson.loads(SEED_CYCLE))
    event = make_event(CASE, 1, 3, payload)
    fresh = make_event(CASE, 1, 3, payload, occurred_at=event.occurred_at)
    values = event.wire_values()
    assert event.wire_values() is values
    assert event.to_json() == fresh.to_json() == orjson.dumps(values, option=orjson.OPT_SORT_KEYS)
    assert event == make_event(CASE, 1, 3, payload, occurred_at=event.occurred_at)
    moved = event.model_copy(update={"tenant_id": "acme"})
    assert moved.wire_values()["tenantId"] == "acme"
    assert event.wire_values()["tenantId"] == "default"
    assert moved != event


def test_nested_timedelta_serializes_as_integer_milliseconds() -> None:
    record = ToolCallRecord(
        tool_name="t", tool_args={}, tool_result=[1], tool_source="local",
        duration=timedelta(seconds=1, microseconds=499_600),
    )
    payload = ReactCyclePayload(
        cycle_index=0, reasoning_text="r", tool_calls=(record, record),
        token_usage=TokenUsage(input_tokens=1, output_tokens=2),
    )
    wire = orjson.loads(make_event(CASE, 1, 0, payload).to_json())
    assert [c["durationMs"] for c in wire["payload"]["toolCalls"]] == [1500, 1500]
    assert all(isinstance(c["durationMs"], int) for c in wire["payload"]["toolCalls"])


def test_failed_tool_call_has_error_and_no_result() -> None:
    record = ToolCallRecord(
        tool_name="t", tool_args={"a": 1}, tool_source="worker",
        duration=timedelta(milliseconds=5), error="boom",
    )
    wire = orjson.loads(orjson.dumps(record.model_dump(mode="json", by_alias=True)))
    assert wire["error"] == "boom"
    assert "toolResult" not in wire
    with pytest.raises(ValueError, match="no toolResult"):
        ToolCallRecord(
            tool_name="t", tool_args={}, tool_source="local", duration=timedelta(0),
            tool_result={"x": 1}, error="boom",
        )


def _valid_wire() -> dict[str, object]:
    payload = CaseCompletedPayload(
        cycles_completed=1, token_totals=TokenUsage(input_tokens=1, output_tokens=1),
        answer={"decision": "approve"},
    )
    result: dict[str, object] = orjson.loads(make_event(CASE, 1, 1, payload).to_json())
    return result


@pytest.mark.parametrize(
    ("mutate", "names"),
    [
        (lambda w: w.__setitem__("schemaVersion", 1), "schemaVersion: 1 is older"),
        (lambda w: w.__setitem__("schemaVersion", 3), "schemaVersion"),
        (lambda w: w.__setitem__("eventType", "CASE_EXPLODED"), "eventType"),
        (lambda w: w.pop("caseId"), "caseId"),
        (lambda w: w["payload"].pop("answer"), "payload.answer"),
        (lambda w: w["payload"].__setitem__("cyclesCompleted", "one"), "cyclesCompleted"),
        (lambda w: w.__setitem__("seq", 7), "eventId"),
        (lambda w: w.__setitem__("occurredAt", "2026-11-29T19:49:19"), "occurredAt"),
        (lambda w: w["payload"].__setitem__("surprise", 1), "surprise"),
    ],
)
def test_malformed_events_are_rejected_naming_the_field(mutate: object, names: str) -> None:
    wire = _valid_wire()
    mutate(wire)  # type: ignore[operator]
    with pytest.raises(InvalidEvent, match=names):
        event_from_json(orjson.dumps(wire))


def test_invalid_json_and_oversized_bodies_are_rejected() -> None:
    with pytest.raises(InvalidEvent, match="not valid JSON"):
        event_from_json(b"{not json")
    with pytest.raises(InvalidEvent, match="byte limit"):
        event_from_json(b" " * 2_000_000)
    with pytest.raises(InvalidEvent, match="JSON object"):
        event_from_json(b"[1,2]")


def test_duration_must_be_an_integer_on_the_wire() -> None:
    raw = orjson.loads(SEED_CYCLE)
    raw["toolCalls"][0]["durationMs"] = 1.5
    with pytest.raises(ValueError, match="integer number of milliseconds"):
        ReactCyclePayload.model_validate(raw)


def test_event_ids_are_uuid5_of_case_attempt_and_seq() -> None:
    for _ in range(50):
        case_id = uuid.uuid4()
        for attempt, seq in ((1, 0), (2, 17), (3, 999)):
            assert event_id_for(case_id, attempt, seq) == uuid.uuid5(
                EVENT_ID_NAMESPACE, f"{case_id}:{attempt}:{seq}")


def test_an_integer_beyond_what_a_double_holds_exactly_still_canonicalises() -> None:
    """RFC 8785 numbers are doubles: a tool's 2**60 + 1 is kept exact as a string, an
    integer a double holds exactly stays a number, and the body still parses."""
    record = ToolCallRecord(tool_name="t", tool_args={"account": 2**60 + 1},
                            tool_result={"big": 13460324501093648, "small": 7},
                            tool_source="local", duration=timedelta(milliseconds=1))
    payload = ReactCyclePayload(cycle_index=0, reasoning_text="r", tool_calls=(record,),
                                token_usage=TokenUsage(input_tokens=1, output_tokens=1))
    body = make_event(CASE, 1, 1, payload).to_json()
    call = orjson.loads(body)["payload"]["toolCalls"][0]
    assert call["toolArgs"] == {"account": "1152921504606846977"}
    assert call["toolResult"] == {"big": 13460324501093648, "small": 7}


def test_one_vocabulary_of_statuses_in_python_sql_and_the_migrations() -> None:
    """Statuses are spelled once (CaseStatus); the migrations' fixed CHECK is held to it,
    and each terminal event type names its status."""
    import re

    from casetrail.contract.events import (
        ENDED_STATUSES,
        TERMINAL_EVENT_TYPES,
        CaseStatus,
        status_for,
    )

    # The latest migration that sets the CHECK holds every status (017 added
    # awaiting_review).
    migrations = sorted((ROOT / "migrations").glob("*.sql"))
    checks = [found for m in migrations
              if (found := re.search(r"CHECK \(status IN\s*\(([^)]*)\)\)", m.read_text()))]
    assert checks
    latest = checks[-1].group(1)
    assert [s.strip().strip("'") for s in latest.split(",")] == list(CaseStatus)
    assert {status_for(t) for t in TERMINAL_EVENT_TYPES} == set(ENDED_STATUSES)
    assert status_for("CASE_TIMED_OUT") is CaseStatus.TIMED_OUT
    assert status_for("REACT_CYCLE") is None


@given(when=st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.timezones()))
@settings(max_examples=examples(500), deadline=None)
def test_a_timestamp_is_written_in_utc_with_microseconds_and_z_from_any_zone(
    when: datetime,
) -> None:
    """The wire form of every timestamp: ISO 8601 in UTC, microseconds always, ``Z``,
    the same text as ``strftime("%Y-%m-%dT%H:%M:%S.%fZ")`` of the same instant."""
    payload = CaseCompletedPayload(
        cycles_completed=1, token_totals=TokenUsage(input_tokens=1, output_tokens=1),
        answer={"decision": "approve"})
    event = make_event(CASE, 1, 1, payload, occurred_at=when)
    written = event.wire_values()["occurredAt"]
    assert written == when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert event_from_json(event.to_json()).occurred_at == when.astimezone(UTC)
