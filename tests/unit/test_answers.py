"""Decisions that hold: the answer given through the final-answer tool and validated
against the agent's schema, refused answers sent back with their errors (each on the
record), and the agent's checks run before the outcome, carried by the signed terminal
event. The whole-stack cases use a local server speaking OpenAI's wire format."""

from __future__ import annotations

from typing import Any

import pytest

from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS, think
from casetrail.audit.resume import RecordedEvent, resumption
from casetrail.engine.answers import FINAL_ANSWER, feedback
from casetrail.engine.chat import AssistantTurn, ToolResultMessage, UserMessage
from casetrail.engine.loop import ReactEngine
from casetrail.engine.scripted import ScriptedModel, call
from tests.support.helpers import ListSink, spec_for, toolbox

APPLICATION = SAMPLE_APPLICATIONS[0]  # A-1001, approved by the lending policy
VALID = {"decision": "refer", "applicantId": "A-1001", "rationale": "an underwriter decides"}


async def run(turns: list[AssistantTurn], **spec: Any) -> ListSink:
    """The loan officer's answers and checks, without review unless asked (these tests
    are about answers; tests/integration/test_review.py about people deciding)."""
    sink = ListSink()
    await ReactEngine(sink).run(spec_for(APPLICATION, **{"review": False, **spec}),
                                ScriptedModel(turns), toolbox())
    return sink


def events_of(sink: ListSink) -> list[Any]:
    """The events, their payloads read as the test knows them to be."""
    return list(sink.events)


def final(answer: dict[str, Any], text: str = "Decided.") -> AssistantTurn:
    return AssistantTurn(text, (call(FINAL_ANSWER, "f", **answer),))


async def test_a_prose_answer_is_sent_back_and_the_typed_one_stands() -> None:
    sink = await run([AssistantTurn('Sure! I think this loan is fine, go ahead.'), final(VALID)])
    assert sink.types == ["CASE_STARTED", "REACT_CYCLE", "REACT_CYCLE", "CASE_COMPLETED"]
    refused = events_of(sink)[1].payload.answer_rejected
    assert refused.answer == "Sure! I think this loan is fine, go ahead."
    assert refused.tool_call_id is None and "final_answer" in refused.errors[0]
    assert events_of(sink)[1].payload.tool_calls == ()
    accepted = events_of(sink)[2].payload
    assert accepted.answer == {**VALID, "reasonCodes": [], "figures": None}
    assert accepted.tool_calls == ()  # the answer is never a tool call
    terminal = events_of(sink)[-1].payload
    assert terminal.answer["decision"] == "refer"
    assert [(c.name, c.passed) for c in terminal.checks] == [
        ("lending-policy-consulted", True), ("names-the-applicant", True),
        ("decline-has-reason-code", True)]
    started = events_of(sink)[0].payload
    assert started.answer_schema_digest is not None


async def test_invalid_answers_beyond_the_limit_fail_the_case_invalid_answer() -> None:
    wrong = {"decision": "maybe", "applicantId": "A-1001", "rationale": "?"}
    sink = await run([final(wrong)] * 3)
    assert sink.types == ["CASE_STARTED", *["REACT_CYCLE"] * 3, "CASE_FAILED"]
    for cycle in events_of(sink)[1:4]:
        rejected = cycle.payload.answer_rejected
        assert rejected.answer == wrong and rejected.tool_call_id == "f"
        assert "decision" in rejected.errors[0]
    failed = events_of(sink)[-1].payload
    assert failed.reason_code == "invalid_answer"
    assert "3 answers refused (at most 2 may be)" in failed.message
    one = await run([final(wrong)] * 2 + [final(VALID)], max_cycles=8)
    assert one.types[-1] == "CASE_COMPLETED"  # two refusals are within the limit


async def test_a_final_answer_beside_other_calls_is_refused_and_the_calls_run() -> None:
    both = AssistantTurn("Both at once.", (call("credit-score", "c1", applicantId="A-1001"),
                                           call(FINAL_ANSWER, "f", **VALID)))
    sink = await run([both, final(VALID)])
    cycle = events_of(sink)[1].payload
    assert [c.tool_name for c in cycle.tool_calls] == ["credit-score"]
    assert "only call of its turn" in cycle.answer_rejected.errors[0]
    assert sink.types[-1] == "CASE_COMPLETED"


async def test_a_blocking_check_refuses_an_approve_for_another_applicant() -> None:
    """The model scores applicant A-3001 on case A-1001 and approves without the policy:
    no approve is recorded; the case fails with each check's verdict on the record."""
    sink = await run([
        AssistantTurn("Scoring.", (call("credit-score", "c1", applicantId="A-3001"),)),
        final({"decision": "approve", "applicantId": "A-1001", "rationale": "score ok"})])
    failed = events_of(sink)[-1]
    assert failed.event_type == "CASE_FAILED"
    assert failed.payload.reason_code == "policy_check_failed"
    verdicts = {c.name: c for c in failed.payload.checks}
    assert not verdicts["names-the-applicant"].passed
    assert "A-3001" in verdicts["names-the-applicant"].detail
    assert not verdicts["lending-policy-consulted"].passed
    assert "approve without consulting lending-policy" in failed.payload.message
    assert all(c.blocking for c in verdicts.values())


@pytest.mark.parametrize("application", SAMPLE_APPLICATIONS)
async def test_the_scripted_agents_pass_every_check(application: dict[str, Any]) -> None:
    sink = ListSink()
    await ReactEngine(sink).run(spec_for(application), ScriptedModel(think), toolbox())
    terminal = events_of(sink)[-1].payload
    # A refer waits for a person; every other decision stands as the agent's.
    assert events_of(sink)[-1].event_type == (
        "CASE_AWAITING_REVIEW" if terminal.answer["decision"] == "refer" else "CASE_COMPLETED")
    assert len(terminal.checks) == 3 and all(c.passed for c in terminal.checks)
    if terminal.answer["decision"] == "decline":
        assert terminal.answer["reasonCodes"]


def test_a_refused_answer_is_rebuilt_exactly_when_a_case_resumes() -> None:
    """The next attempt sends the model what the first one did: the refused call and
    its error, or the message after a prose answer."""
    when: Any = None  # (when they happened does not matter here)
    started = RecordedEvent(1, 0, "CASE_STARTED", {}, when)
    usage = {"inputTokens": 1, "outputTokens": 1}
    cycles = [
        {"cycleIndex": 0, "reasoningText": "in prose", "toolCalls": [], "tokenUsage": usage,
         "answerRejected": {"answer": "in prose", "errors": ["give it by calling final_answer"]}},
        {"cycleIndex": 1, "reasoningText": "typed", "toolCalls": [], "tokenUsage": usage,
         "answerRejected": {"answer": {"decision": "maybe"}, "errors": ["decision: bad"],
                            "toolCallId": "f1"}},
    ]
    found = resumption([started, *(RecordedEvent(1, i + 1, "REACT_CYCLE", c, when)
                                   for i, c in enumerate(cycles))], {})
    assert found is not None and found.rejections == 2 and found.answer is None
    messages: list[Any] = list(found.messages)
    assert messages[1] == UserMessage(feedback(["give it by calling final_answer"]))
    assert messages[2].tool_calls[0].name == FINAL_ANSWER
    assert messages[3] == ToolResultMessage("f1", FINAL_ANSWER,
                                            f"ERROR: {feedback(['decision: bad'])}",
                                            is_error=True)












