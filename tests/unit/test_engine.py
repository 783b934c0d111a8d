"""The ReAct loop driven by the scripted model, asserted as whole event sequences."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import BaseModel

from casetrail.agents import loan_officer
from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.contract.events import ZERO_USAGE, ReactCycle
from casetrail.engine.case import CancelSignal, extract_answer
from casetrail.engine.chat import (
    AssistantTurn,
    ChatMessage,
    SystemMessage,
    ToolCallRequest,
    ToolSpec,
    UserMessage,
    count_tokens,
    message_text,
)
from casetrail.engine.loop import ReactEngine
from casetrail.engine.scripted import ScriptedModel, call
from casetrail.engine.tools import InProcessWorkerRuntime, LocalTool, ToolBox, WorkerTool
from casetrail.errors import ModelRejected, ModelUnavailable
from tests.support.helpers import ListSink, spec_for, toolbox


def assert_well_formed(sink: ListSink) -> None:
    """One attempt: started, and ended by one terminal event, or by a wait for review."""
    assert [e.seq for e in sink.events] == list(range(len(sink.events)))
    assert sink.types[0] == "CASE_STARTED"
    parked = sink.types[-1] == "CASE_AWAITING_REVIEW"
    assert sum(e.is_terminal for e in sink.events) == (0 if parked else 1)
    assert parked or sink.events[-1].is_terminal
    assert len({e.event_id for e in sink.events}) == len(sink.events)


async def run(model: Any, tools: ToolBox | None = None, **spec: Any) -> ListSink:
    sink = ListSink()
    case_input = spec.pop("case_input", SAMPLE_APPLICATIONS[0])
    cancel = spec.pop("cancel", None)
    await ReactEngine(sink).run(spec_for(case_input, **spec), model, tools or toolbox(), cancel)
    return sink


LOAN_SCRIPT = loan_officer.think  # the loan officer's scripted brain


@pytest.mark.parametrize(
    ("application", "decision"),
    list(zip(SAMPLE_APPLICATIONS, ["approve", "refer", "decline"], strict=True)),
)
async def test_loan_officer_reaches_known_decisions(application: dict[str, Any],
                                                    decision: str) -> None:
    sink = await run(ScriptedModel(LOAN_SCRIPT), case_input=application)
    assert_well_formed(sink)
    ending = "CASE_AWAITING_REVIEW" if decision == "refer" else "CASE_COMPLETED"
    assert sink.types == ["CASE_STARTED"] + ["REACT_CYCLE"] * 4 + [ending]
    cycles = [e for e in sink.events if isinstance(e, ReactCycle)]
    assert [c.payload.cycle_index for c in cycles] == [0, 1, 2, 3]
    assert cycles[1].payload.reasoning_text.startswith("The credit score is")
    names = [[t.tool_name for t in c.payload.tool_calls] for c in cycles]
    assert names == [["credit-score"], ["risk-model-retrieval", "debt-to-income"],
                     ["lending-policy"], []]
    sources = {t.tool_name: t.tool_source for c in cycles for t in c.payload.tool_calls}
    assert sources["credit-score"] == "worker" and sources["debt-to-income"] == "local"
    terminal = sink.events[-1]
    assert terminal.payload.answer["decision"] == decision  # type: ignore[union-attr,index]
    total = sum((c.payload.token_usage for c in cycles), ZERO_USAGE)
    assert terminal.payload.token_totals == total  # type: ignore[union-attr]
    assert terminal.payload.cycles_completed == 4  # type: ignore[union-attr]
    assert total.input_tokens > 0 and total.output_tokens > 0


class Pair(BaseModel):
    label: str


async def test_parallel_tool_calls_run_concurrently_and_keep_order() -> None:
    barrier = asyncio.Barrier(2)

    async def meet(args: Pair) -> str:
        # Each call waits for the other: run one after the other, they would
        # never meet and the deadline would end the case.
        await barrier.wait()
        return args.label

    tools = ToolBox([LocalTool("meet", "waits for a peer", Pair, meet)],
                    InProcessWorkerRuntime({}))
    model = ScriptedModel([
        AssistantTurn("both", (call("meet", "a", label="first"),
                               call("meet", "b", label="second"))),
        AssistantTurn("done"),
    ])
    sink = await run(model, tools, deadline=5, typed=False)
    assert_well_formed(sink)
    assert sink.types[-1] == "CASE_COMPLETED"
    calls = sink.events[1].payload.tool_calls  # type: ignore[union-attr]
    assert [(c.tool_call_id, c.tool_result) for c in calls] == [("a", "first"), ("b", "second")]


async def test_every_tool_failure_is_an_observation_not_a_crash() -> None:
    def explode(args: Pair) -> str:
        raise RuntimeError("ledger offline")

    tools = ToolBox(
        [
            LocalTool("explode", "always fails", Pair, explode),
            LocalTool("echo", "echoes", Pair, lambda a: a.label),
            WorkerTool("remote", "no worker serves it", "nobody-home", Pair),
        ],
        InProcessWorkerRuntime({}),
    )
    seen: list[list[str]] = []

    def script(messages: Sequence[ChatMessage]) -> AssistantTurn:
        if len(messages) == 2:
            return AssistantTurn("try everything", (
                call("missing-tool", "1"),
                ToolCallRequest("2", "echo", None, raw_arguments="{label: oops"),
                call("echo", "3", label=7),
                call("explode", "4", label="x"),
                call("remote", "5", label="x"),
            ))
        seen.append([m.content for m in messages[-5:]])  # type: ignore[union-attr]
        return AssistantTurn("recovered")

    sink = await run(ScriptedModel(script), tools, typed=False)
    assert_well_formed(sink)
    assert sink.types[-1] == "CASE_COMPLETED"
    records = sink.events[1].payload.tool_calls  # type: ignore[union-attr]
    errors = [r.error for r in records]
    assert all(e is not None for e in errors)
    assert all(r.tool_result is None for r in records)
    assert "unknown tool 'missing-tool'" in errors[0]  # type: ignore[operator]
    assert "not a JSON object" in errors[1] and records[1].raw_args == "{label: oops"  # type: ignore[operator]
    assert "label: Input should be a valid string" in errors[2]  # type: ignore[operator]
    assert "ledger offline" in errors[3]  # type: ignore[operator]
    assert "nobody-home" in errors[4]  # type: ignore[operator]
    assert records[4].tool_source == "worker" and records[4].attempts[0].outcome == "error"
    assert all(content.startswith("ERROR: ") for content in seen[0])
    assert "null" not in [r.tool_result for r in records]


async def test_max_cycles_fails_the_case_with_its_own_reason() -> None:
    loop_forever = ScriptedModel(lambda m: AssistantTurn("again", (call("debt-to-income", "x",
                                 monthlyDebt=1, monthlyIncome=2),)))
    sink = await run(loop_forever, max_cycles=3)
    assert_well_formed(sink)
    assert sink.types == ["CASE_STARTED"] + ["REACT_CYCLE"] * 3 + ["CASE_FAILED"]
    assert sink.events[-1].payload.reason_code == "max_cycles"  # type: ignore[union-attr]
    assert sink.events[-1].payload.cycles_completed == 3  # type: ignore[union-attr]


class SlowAfter:
    """Answers ``fast`` turns at once, then takes ``delay`` seconds a turn."""

    def __init__(self, fast: int, delay: float) -> None:
        self.fast, self.delay, self.calls = fast, delay, 0

    @property
    def name(self) -> str:
        return "slow-after"

    async def request(self, messages: Sequence[ChatMessage],
                      tools: Sequence[ToolSpec]) -> AssistantTurn:
        self.calls += 1
        if self.calls > self.fast:
            await asyncio.sleep(self.delay)
        return AssistantTurn("working", (call("debt-to-income", f"c{self.calls}", monthlyDebt=1,
                                              monthlyIncome=2),))


async def test_deadline_during_a_slow_model_call_counts_completed_cycles() -> None:
    sink = await run(SlowAfter(fast=2, delay=30), deadline=0.5)
    assert_well_formed(sink)
    assert sink.types == ["CASE_STARTED", "REACT_CYCLE", "REACT_CYCLE", "CASE_TIMED_OUT"]
    assert sink.events[-1].payload.cycles_completed == 2  # type: ignore[union-attr]


async def test_cancellation_during_a_model_call() -> None:
    cancel = CancelSignal()
    asyncio.get_running_loop().call_later(0.2, cancel.cancel, "applicant withdrew")
    sink = await run(SlowAfter(fast=1, delay=30), cancel=cancel)
    assert_well_formed(sink)
    assert sink.types == ["CASE_STARTED", "REACT_CYCLE", "CASE_CANCELLED"]
    payload = sink.events[-1].payload
    assert payload.reason == "applicant withdrew" and not payload.while_queued  # type: ignore[union-attr]


async def test_cancellation_after_a_tool_call_records_the_cycle_and_no_further_turn() -> None:
    cancel = CancelSignal()

    async def cancel_now(args: Pair) -> str:
        # Takes effect once this tool call has returned: the cycle is recorded, and
        # the next model turn never completes.
        asyncio.get_running_loop().call_soon(cancel.cancel, "stop")
        return "ok"

    tools = ToolBox([LocalTool("stopper", "cancels", Pair, cancel_now)], InProcessWorkerRuntime({}))
    model = ScriptedModel([AssistantTurn("go", (call("stopper", "1", label="x"),)),
                           AssistantTurn("never answered")], latency=0.05)
    sink = await run(model, tools, cancel=cancel)
    assert sink.types == ["CASE_STARTED", "REACT_CYCLE", "CASE_CANCELLED"]
    assert model._served == 1


class Flaky:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures

    @property
    def name(self) -> str:
        return "flaky"

    async def request(self, messages: Sequence[ChatMessage],
                      tools: Sequence[ToolSpec]) -> AssistantTurn:
        if self.failures:
            raise self.failures.pop(0)
        return AssistantTurn('{"decision": "approve"}')


async def test_transient_model_errors_are_retried_and_recorded() -> None:
    sink = await run(Flaky([ModelUnavailable("429 slow down", retry_after=0.01),
                            ModelUnavailable("503", retry_after=0.02)]), typed=False)
    assert sink.types == ["CASE_STARTED", "REACT_CYCLE", "CASE_COMPLETED"]
    retries = sink.events[1].payload.model_retries  # type: ignore[union-attr]
    assert [r.reason for r in retries] == ["429 slow down", "503"]
    assert sink.events[-1].payload.answer == {"decision": "approve"}  # type: ignore[union-attr]


async def test_permanent_model_error_fails_the_case() -> None:
    sink = await run(Flaky([ModelRejected("401 invalid api key")]))
    assert sink.types == ["CASE_STARTED", "CASE_FAILED"]
    assert sink.events[-1].payload.reason_code == "model_error"  # type: ignore[union-attr]
    assert "401" in sink.events[-1].payload.message  # type: ignore[union-attr]


async def test_a_model_adapter_that_raises_ends_the_case_saying_why() -> None:
    """A bug in a model adapter or a team's script (here: a KeyError) fails the case as
    internal_error with the exception, the same on every attempt, instead of leaving the
    attempt without an end (its start command unsettled, the case stalled)."""
    sink = await run(Flaky([KeyError("choices")]))
    assert sink.types == ["CASE_STARTED", "CASE_FAILED"]
    failed = sink.events[-1].payload
    assert failed.reason_code == "internal_error"  # type: ignore[union-attr]
    assert "KeyError" in failed.message and "choices" in failed.message  # type: ignore[union-attr]


def test_answer_extraction() -> None:
    assert extract_answer('{"a": 1}') == {"a": 1}
    assert extract_answer('text\n```json\n{"a": 2}\n```') == {"a": 2}
    assert extract_answer("plain words") == {"answer": "plain words"}
    assert extract_answer("[1, 2]") == {"answer": "[1, 2]"}


class SlowConfirmSink(ListSink):
    """A sink whose broker takes a while to confirm; it logs sends and confirms."""

    def __init__(self, log: list[str], delay: float) -> None:
        super().__init__()
        self.log, self.delay = log, delay

    async def emit(self, event: Any) -> None:
        self.log.append(f"sent {event.seq}")
        await asyncio.sleep(self.delay)
        self.events.append(event)
        self.log.append(f"confirmed {event.seq}")


class LoggingModel(ScriptedModel):
    def __init__(self, log: list[str], turns: Sequence[AssistantTurn]) -> None:
        super().__init__(turns, latency=0.05)
        self.log = log

    async def request(self, messages: Sequence[ChatMessage],
                      tools: Sequence[ToolSpec]) -> AssistantTurn:
        self.log.append("model asked")
        return await super().request(messages, tools)


async def test_events_are_confirmed_in_order_and_nothing_acts_before_the_trail_is_durable(
) -> None:
    log: list[str] = []

    async def act(args: Pair) -> str:
        log.append("tool ran")
        return "ok"

    tools = ToolBox([LocalTool("act", "acts", Pair, act)], InProcessWorkerRuntime({}))
    model = LoggingModel(log, [AssistantTurn("one", (call("act", "1", label="a"),)),
                               AssistantTurn("two", (call("act", "2", label="b"),)),
                               AssistantTurn('{"done": true}')])
    sink = SlowConfirmSink(log, delay=0.02)
    await ReactEngine(sink).run(spec_for(SAMPLE_APPLICATIONS[0], typed=False), model, tools)
    assert sink.types == ["CASE_STARTED", "REACT_CYCLE", "REACT_CYCLE", "REACT_CYCLE",
                          "CASE_COMPLETED"]
    for seq in range(len(sink.events) - 1):
        # One event in flight at a time: the next is sent only after this confirm.
        assert log.index(f"confirmed {seq}") < log.index(f"sent {seq + 1}")
    assert log[-1] == f"confirmed {len(sink.events) - 1}"  # the run ends confirmed
    for position, entry in enumerate(log):
        if entry == "tool ran":
            sent = sum(e.startswith("sent") for e in log[:position])
            confirmed = sum(e.startswith("confirmed") for e in log[:position])
            assert sent == confirmed  # every earlier event durable before a tool acts
    # The model's turn overlaps the previous event's confirm (the model changes
    # nothing outside, so it need not wait).
    assert log.index("model asked") < log.index("confirmed 0")


async def test_scripted_prompt_tokens_match_a_full_count_as_the_conversation_changes(
) -> None:
    model = ScriptedModel([AssistantTurn("ok")] * 4)
    conversation: list[ChatMessage] = [SystemMessage("s" * 40), UserMessage("u" * 80)]

    async def prompt_tokens(messages: list[ChatMessage]) -> int:
        turn = await model.request(messages, [])
        return turn.usage.input_tokens

    def full(messages: list[ChatMessage]) -> int:
        return sum(count_tokens(message_text(m)) for m in messages)

    assert await prompt_tokens(list(conversation)) == full(conversation)
    conversation.append(UserMessage("more " * 30))  # grown: the earlier total is reused
    assert await prompt_tokens(list(conversation)) == full(conversation)
    conversation[1] = UserMessage("short")  # an earlier message replaced (trimmed)
    assert await prompt_tokens(list(conversation)) == full(conversation)
    assert await prompt_tokens(conversation[:1]) == full(conversation[:1])  # shorter


@pytest.mark.parametrize("ending", ["completed", "failed", "timed_out", "cancelled"])
async def test_decided_is_told_once_after_the_last_turn_and_before_the_terminal_event(
    ending: str,
) -> None:
    """The worker hands a case's slot to the next case when the engine says the outcome
    is decided: after every model turn and tool call, before the terminal event."""
    sink, told = ListSink(), []
    cancel = CancelSignal()
    model: Any = {
        "completed": ScriptedModel(LOAN_SCRIPT),
        "failed": Flaky([ModelRejected("400 bad request")]),
        "timed_out": SlowAfter(fast=1, delay=30),
        "cancelled": SlowAfter(fast=1, delay=30),
    }[ending]
    if ending == "cancelled":
        asyncio.get_running_loop().call_later(0.2, cancel.cancel, "withdrawn")

    def decided() -> None:
        told.append(len(sink.events))
        if hasattr(model, "calls"):
            told.append(model.calls)

    await ReactEngine(sink).run(spec_for(SAMPLE_APPLICATIONS[0], deadline=0.5
                                         if ending == "timed_out" else 30),
                                model, toolbox(), cancel, decided=decided)
    assert_well_formed(sink)
    assert sink.events[-1].event_type == f"CASE_{ending.upper()}"
    # After it, only the terminal event (and the one before it, if its publish was
    # still in flight: at most one ever is) reaches the sink.
    assert len(sink.events) - told[0] in (1, 2)
    if hasattr(model, "calls"):  # nothing asked of the model after it
        assert told[1] == model.calls
    assert len(told) == (2 if hasattr(model, "calls") else 1)
