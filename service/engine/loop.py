"""The ReAct loop, one attempt of one case, as an explicit state machine.

    CASE_STARTED → [check cancel → model request → tool calls → REACT_CYCLE]* → terminal
                                                                      or CASE_AWAITING_REVIEW

Every step emits its event *as it happens* through an ``EventSink``. Events
are published one at a time, each only after the broker confirmed the one
before (so an attempt's trail never has a gap), and nothing acts in the world
until the trail before it is durable: tool calls and the terminal event wait
for the confirm of every earlier event. Only the model request, which changes
nothing outside, runs while the previous event's confirm is on its way; with a
real model that hides the broker's confirm latency entirely.
The state of the run (conversation, cycle index, usage, deadline, seq) lives
in one ``RunState``. Exactly one terminal event ends every attempt the loop
runs to its end: ``CASE_COMPLETED``, ``CASE_FAILED``, ``CASE_TIMED_OUT`` or
``CASE_CANCELLED``; or the attempt ends with ``CASE_AWAITING_REVIEW`` when a person
decides next (the next attempt records their ``CASE_REVIEWED``, then the terminal
event, or more cycles when they returned the case).

A tool failure is an observation for the model; a provider outage is a
failure of the run. The deadline and cancellation abandon in-flight model and
tool calls, never a half-published event.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from tenacity import wait_exponential_jitter

from casetrail.contract.events import (
    ZERO_USAGE,
    AnswerRejection,
    CaseAwaitingReview,
    CaseAwaitingReviewPayload,
    CaseCancelledPayload,
    CaseCompletedPayload,
    CaseFailedPayload,
    CaseStartedPayload,
    CaseTimedOutPayload,
    CheckResult,
    Event,
    JsonObject,
    ModelRetry,
    Payload,
    PendingQuestion,
    ReactCyclePayload,
    ReviewReason,
    TerminalEvent,
    ToolCallRecord,
    ToolOffer,
    TraceRef,
    make_event,
    status_for,
)
from casetrail.contract.version import CASETRAIL_VERSION
from casetrail.engine.answers import (
    ASK_A_PERSON,
    ASK_A_PERSON_SPEC,
    DEFAULT_ANSWER_RETRIES,
    FINAL_ANSWER,
    Answering,
    feedback,
    refused,
    returned_note,
)
from casetrail.engine.backoff import backoff_delay
from casetrail.engine.budget import within_budget
from casetrail.engine.case import (
    AttemptEnd,
    CancelSignal,
    CaseSpec,
    EventSink,
    Parked,
    Resume,
    RunState,
    extract_answer,
    first_user_message,
    fit_to_budget,
    resume_point,
    system_prompt_digest,
)
from casetrail.engine.chat import (
    AssistantTurn,
    ChatMessage,
    ChatModel,
    SystemMessage,
    ToolCallRequest,
    ToolResultMessage,
    UserMessage,
)
from casetrail.engine.observing import NO_OBSERVER, AttemptWatch, Observer
from casetrail.engine.recorded import cycle_messages
from casetrail.engine.tools import ToolBox, ToolOutcome, schema_digest
from casetrail.errors import CasetrailError, ModelRejected, ModelUnavailable, scrub

T = TypeVar("T")


def _trace_ref(watch: AttemptWatch) -> TraceRef | None:
    found = watch.trace_ids()
    return None if found is None else TraceRef(trace_id=found[0], span_id=found[1])

MODEL_RETRY_ATTEMPTS = 6
"""Transient provider failures retried within one cycle before the case fails."""

OVERLAP_MIN_MODEL_SECONDS = 0.002
"""A model turn at least this long runs while the previous event's confirm is on its way."""

log = logging.getLogger("casetrail.engine")


class _Interrupted(Exception):
    """A guarded call was abandoned; ``kind`` says why."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class ReactEngine:
    """Runs attempts of cases: the model, the tools, and the trail of events."""

    def __init__(self, sink: EventSink,
                 redact: Callable[[uuid.UUID, str], str] | None = None,
                 observer: Observer = NO_OBSERVER) -> None:
        self._sink = sink
        self._redact = redact
        """How the case's sensitive values leave the process (traces with content)."""
        self._observer = observer

    async def run(
        self,
        spec: CaseSpec,
        model: ChatModel,
        tools: ToolBox,
        cancel: CancelSignal | None = None,
        decided: Callable[[], None] | None = None,
    ) -> AttemptEnd:
        """Run one attempt to its end and return the event that ended it. ``decided`` is
        called once the outcome is known and nothing is left to ask the model or the
        tools: only the terminal event's publish and confirm remain (the worker gives
        the case's slot to the next case then)."""
        cancel = cancel or CancelSignal()
        loop = asyncio.get_running_loop()
        allowed = spec.limits.deadline_seconds if spec.deadline_at is None else \
            (spec.deadline_at - datetime.now(UTC)).total_seconds()
        state = RunState(
            spec=spec,
            deadline=loop.time() + allowed,
            messages=[],
            watch=self._observer.attempt(
                agent=spec.agent, agent_version=spec.agent_version, case_id=str(spec.case_id),
                attempt=spec.attempt, provider=spec.model.provider, model=spec.model.name,
                redact=self._redactor(spec.case_id)),
            decided=decided,
        )
        state.add(SystemMessage(spec.system_prompt), UserMessage(first_user_message(spec.input)))
        state.specs = tools.specs if spec.answering is None else \
            [*tools.specs, spec.answering.spec]
        if spec.asks_people:
            state.specs = [*state.specs, ASK_A_PERSON_SPEC]
        if spec.resumption is not None:  # the recorded cycles are not asked again
            state.add(*spec.resumption.messages)
            state.cycles, state.usage = spec.resumption.cycles, spec.resumption.usage
            state.tool_calls = list(spec.resumption.tool_calls)
            state.rejections = spec.resumption.rejections
            state.returns = spec.resumption.returns

        def deadline_passed() -> None:
            state.deadline_passed = True
            cancel.interrupt()

        # One timer for the whole attempt, not one per guarded call.
        timer = loop.call_at(state.deadline, deadline_passed)
        try:
            return await self._attempt(state, model, tools, cancel)
        finally:
            timer.cancel()
            state.watch.finish()
            if state.in_flight is not None and not state.in_flight.done():
                state.in_flight.cancel()  # the attempt was abandoned (shutdown)

    async def _attempt(
        self, state: RunState, model: ChatModel, tools: ToolBox, cancel: CancelSignal
    ) -> AttemptEnd:
        spec = state.spec
        await self._send(state, self._started_payload(spec, tools, state.watch))
        state.watch.started()
        resumed = spec.resumption
        parked = None if resumed is None else resumed.parked
        match resume_point(spec, cancel.is_set):
            case Resume.CANCELLED_WHILE_WAITING:
                assert parked is not None
                if parked.review is None and spec.review is not None:
                    await self._emit(state, spec.review)  # done before the cancel: on record
            case Resume.ANSWERED:
                assert parked is not None and parked.question is not None
                await self._answered(state, parked.question, parked)
            case Resume.REVIEWED:
                assert parked is not None
                ended = await self._reviewed(state, parked)
                if ended is not None:
                    return ended
            case Resume.ANSWER_UNJUDGED:
                assert resumed is not None and resumed.answer is not None \
                    and spec.answering is not None
                return await self._decide(state, spec.answering, resumed.answer)
            case Resume.FRESH:
                pass
        while True:
            if cancel.is_set:
                return await self._cancelled(state, cancel)
            if state.cycles >= spec.limits.max_cycles * (1 + state.returns):
                return await self._failed(
                    state, "max_cycles", f"no answer after {state.cycles} cycles"
                )
            terminal = await self._cycle_or_end(state, model, tools, cancel)
            if terminal is not None:
                return terminal

    async def _cycle_or_end(
        self, state: RunState, model: ChatModel, tools: ToolBox, cancel: CancelSignal
    ) -> AttemptEnd | None:
        """One cycle, or how the attempt ends when the cycle cannot go on: interrupted
        (cancel, deadline), the model refused or away, or a foreign exception."""
        try:
            return await self._cycle(state, model, tools, cancel)
        except _Interrupted as stop:
            if stop.kind == "cancelled":
                return await self._cancelled(state, cancel)
            return await self._timed_out(state)
        except ModelRejected as exc:
            return await self._failed(state, "model_error", str(exc))
        except ModelUnavailable as exc:
            return await self._failed(
                state, "model_error", f"provider unavailable after retries: {exc}"
            )
        except CasetrailError:
            raise  # the bus or the store: the attempt is handed back and runs again
        except Exception as exc:  # a bug in a model adapter, a script or a tool's code
            # It would fail again on every attempt: the case ends, saying why, instead
            # of stalling with its start command unsettled.
            log.exception("case %s attempt %d: a cycle raised", state.spec.case_id,
                          state.spec.attempt)
            return await self._failed(state, "internal_error", scrub(
                f"cycle {state.cycles} raised {type(exc).__name__}: {exc}"))

    async def _reviewed(self, state: RunState, parked: Parked) -> AttemptEnd | None:
        """Take up a case a person reviewed: record their review (unless an earlier
        attempt did), then end it with their decision, or, when they returned it, go on
        with their note in the conversation (``None``)."""
        review = parked.review
        if review is None:
            review = state.spec.review
            if review is None:  # the worker re-parks such a case; never decide without one
                raise ValueError(f"case {state.spec.case_id} is parked and has no review")
            await self._emit(state, review)
            if review.verdict == "return":
                state.returns += 1
                state.add(returned_note(state.messages, review.reason))
        if review.verdict == "return":
            return None
        answer = parked.answer if review.verdict == "confirm" else review.decision
        assert answer is not None
        if review.verdict == "override" and state.spec.override_reviewers > 1:
            # Four eyes on an override: it stands once a second person confirms it.
            return await self._park(state, answer, parked.checks, ["second_review"])
        return await self._terminal(state, CaseCompletedPayload(
            cycles_completed=state.cycles, token_totals=state.usage, answer=answer,
            checks=parked.checks, decided_by="reviewer"))

    async def _answered(self, state: RunState, question: PendingQuestion, parked: Parked
                        ) -> None:
        """Record the turn that waited for a person's answer, in full (the question's
        result saying who answered), and go on with the answer in the conversation."""
        given = state.spec.given
        if given is None or given.call_id != question.call_id:
            raise ValueError(f"case {state.spec.case_id} waits on question "
                             f"{question.call_id} and has no answer to it")
        asked = parked.asked_at or given.answered_at
        record = ToolCallRecord(
            tool_name=ASK_A_PERSON, tool_args={"question": question.question},
            tool_result={"answer": given.answer, "answeredBy": given.answered_by,
                         **({} if given.action is None else {"action": given.action})},
            tool_source="local", duration=max(given.answered_at - asked, timedelta(0)),
            tool_call_id=question.call_id)
        calls = list(question.tool_calls)
        calls.insert(min(question.question_index, len(calls)), record)
        payload = ReactCyclePayload(
            cycle_index=state.cycles, reasoning_text=question.reasoning_text,
            tool_calls=tuple(calls), token_usage=question.token_usage, model=question.model,
            finish_reason=question.finish_reason, model_retries=question.model_retries)
        event = await self._emit(state, payload)
        state.add(*cycle_messages(event.wire_values()["payload"]))
        state.usage = state.usage + question.token_usage
        state.cycles += 1
        state.watch.cycle(ZERO_USAGE)  # its tokens were counted when the model asked
        if state.spec.answering is not None and state.spec.answering.checks:
            state.cycles_sent.append(event)

    async def _ask(self, state: RunState, turn: AssistantTurn, model: ChatModel,
                   questions: Sequence[ToolCallRequest], outcomes: Sequence[ToolOutcome],
                   asked_in: Sequence[ToolCallRequest]) -> CaseAwaitingReview:
        """Park the case on the model's question: the rest of the turn (its other calls
        run) waits with it; its REACT_CYCLE is recorded once a person has answered."""
        first = questions[0]
        records = [o.record for o in outcomes]
        text = (first.arguments or {}).get("question")
        reasoning = _reasoning(turn)
        pending = PendingQuestion(
            call_id=first.id, question=str(text), question_index=list(asked_in).index(first),
            reasoning_text=reasoning, tool_calls=tuple(records), token_usage=turn.usage,
            model=turn.model or model.name, finish_reason=turn.finish_reason,
            model_retries=tuple(state.retries))
        return await self._wait(state, CaseAwaitingReviewPayload(
            cycles_completed=state.cycles, token_totals=state.usage, question=pending,
            review_reasons=("question",)))

    async def _cycle(
        self, state: RunState, model: ChatModel, tools: ToolBox, cancel: CancelSignal
    ) -> AttemptEnd | None:
        state.retries = []
        prompt, trimmed = fit_to_budget(state.messages, state.spec.context_budget, state.tokens)
        asked = asyncio.get_running_loop().time()
        turn = await self._request(state, prompt, model, tools, cancel)
        state.model_seconds = asyncio.get_running_loop().time() - asked
        state.usage = state.usage + turn.usage
        state.add(turn.as_message())
        answering = state.spec.answering
        calls, finals, questions, asked_in = _sorted_calls(state.spec, turn)
        outcomes: list[ToolOutcome] = []
        if calls:
            await self._settle(state)  # the trail so far is durable before anything acts
            # The same key on every attempt: a capability worker that already answered
            # this cycle's call (before its worker died) answers again from memory.
            key = f"{state.spec.case_id}:{state.cycles}"
            outcomes = within_budget(
                await self._guard(state, cancel, tools.run_all(calls, key)),
                state.spec.max_event_bytes, _reasoning(turn))
            state.add(*(o.observation for o in outcomes))
        if questions:  # a person answers first; the turn is recorded with the answer
            return await self._ask(state, turn, model, questions, outcomes, asked_in)
        answer, rejected = None, None
        if answering is not None:
            answer, rejected = self._answer_of(state, answering, turn, calls, finals)
        sent = await self._send(
            state,
            ReactCyclePayload(
                cycle_index=state.cycles,
                reasoning_text=_reasoning(turn),
                tool_calls=tuple(o.record for o in outcomes),
                token_usage=turn.usage,
                model=turn.model or model.name,
                finish_reason=turn.finish_reason,
                model_retries=tuple(state.retries),
                trimmed_observations=tuple(trimmed),
                answer=answer,
                answer_rejected=rejected,
            ),
        )
        state.retries = []
        state.cycles += 1
        state.watch.cycle(turn.usage)
        if answering is None:  # a free-text answer: the turn without calls is the last
            return None if turn.tool_calls else await self._completed(state, turn)
        if answering.checks and outcomes:
            state.cycles_sent.append(sent)  # its calls, for the checks
        return await self._typed_answer(state, answering, answer, rejected)

    async def _typed_answer(self, state: RunState, answering: Answering,
                            answer: JsonObject | None, rejected: AnswerRejection | None
                            ) -> AttemptEnd | None:
        """After a cycle of an agent with a typed answer: its answer decided, or the
        case failed for too many refused answers, or (``None``) the loop goes on."""
        if answer is not None:
            return await self._decide(state, answering, answer)
        if rejected is None:
            return None
        state.rejections += 1
        allowed = state.spec.limits.max_answer_retries
        allowed = DEFAULT_ANSWER_RETRIES if allowed is None else allowed
        if state.rejections <= allowed:
            return None
        return await self._failed(state, "invalid_answer", (
            f"{state.rejections} answers refused (at most {allowed} may be): "
            + "; ".join(rejected.errors)))

    async def _completed(self, state: RunState, turn: AssistantTurn) -> TerminalEvent:
        """The case completed with the turn's text as its answer (an agent without a
        typed answer)."""
        return await self._terminal(
            state,
            CaseCompletedPayload(
                cycles_completed=state.cycles, token_totals=state.usage,
                answer=extract_answer(turn.text), decided_by="agent",
            ),
        )

    async def _request(
        self,
        state: RunState,
        prompt: Sequence[ChatMessage],
        model: ChatModel,
        tools: ToolBox,
        cancel: CancelSignal,
    ) -> AssistantTurn:
        """One model turn; transient provider failures are retried with backoff and
        jitter (honouring ``Retry-After``) inside the deadline, and each retry is kept."""
        backoff = wait_exponential_jitter(multiplier=0.5, max=20.0, jitter=0.5)
        for attempt in range(1, MODEL_RETRY_ATTEMPTS + 1):
            watch = state.watch.model_call(model.name, prompt)
            asked = time.perf_counter()
            try:
                turn = await self._guard(state, cancel, model.request(prompt, state.specs))
            except ModelUnavailable as exc:
                watch.failed("provider_unavailable", str(exc), time.perf_counter() - asked,
                             counted="retryable")
                if attempt == MODEL_RETRY_ATTEMPTS:
                    raise
                delay = exc.retry_after if exc.retry_after is not None else backoff_delay(
                    backoff, attempt
                )
                if delay >= state.remaining():
                    raise _Interrupted("deadline") from exc
                state.retries.append(
                    ModelRetry(
                        at=datetime.now(UTC), reason=str(exc), waited=timedelta(seconds=delay)
                    )
                )
                state.watch.retried()
                await self._guard(state, cancel, asyncio.sleep(delay))
            except BaseException as exc:  # refused, or abandoned (deadline, cancel, shutdown)
                kind = exc.kind if isinstance(exc, _Interrupted) else type(exc).__name__
                watch.failed(kind, str(exc), time.perf_counter() - asked,
                             counted="refused" if isinstance(exc, ModelRejected) else None)
                raise
            else:
                watch.answered(turn, time.perf_counter() - asked)
                return turn
        raise AssertionError("unreachable")  # pragma: no cover

    async def _guard(self, state: RunState, cancel: CancelSignal, work: Awaitable[T]) -> T:
        """Await ``work`` unless the deadline passes or the case is cancelled first;
        then the work is abandoned (cancelled) and ``_Interrupted`` says which.

        The work runs in the case's own task (no task per call, this is the hot
        path); the attempt's deadline timer and a cancel request both cancel this
        task, which is told apart from any other cancellation and undone.
        """
        interrupted = "cancelled" if cancel.is_set else "deadline" if state.deadline_passed \
            else None
        if interrupted is not None:
            if inspect.iscoroutine(work):
                work.close()
            raise _Interrupted(interrupted)
        task = asyncio.current_task()
        assert task is not None
        cancel.guard(task)
        try:
            return await work
        except asyncio.CancelledError:
            if not cancel.took_interruption(task):
                raise  # somebody else's cancellation (shutdown): let it through
            task.uncancel()
            raise _Interrupted("cancelled" if cancel.is_set else "deadline") from None
        finally:
            cancel.unguard(task)

    def _started_payload(self, spec: CaseSpec, tools: ToolBox, watch: AttemptWatch
                         ) -> CaseStartedPayload:
        return CaseStartedPayload(
            agent=spec.agent,
            agent_version=spec.agent_version,
            casetrail_version=CASETRAIL_VERSION,
            model=spec.model,
            system_prompt_digest=system_prompt_digest(spec.system_prompt),
            tools_offered=tuple(
                ToolOffer(name=name, source=source, description=description,
                          input_schema_digest=digest)
                for name, source, description, digest in tools.offers
            ) + ((ToolOffer(name=ASK_A_PERSON, source="local",
                            description=ASK_A_PERSON_SPEC.description,
                            input_schema_digest=schema_digest(ASK_A_PERSON_SPEC.parameters)),)
                 if spec.asks_people else ()),
            limits=spec.limits,
            input=spec.input,
            restart_reason=spec.restart_reason,
            started_by=spec.started_by,
            trace=_trace_ref(watch),
            resumed_from=None if spec.resumption is None else spec.resumption.resumed_from,
            agent_digest=spec.agent_digest,
            answer_schema_digest=None if spec.answering is None
            else spec.answering.schema_digest,
            start_action=spec.start_action,
            mcp_catalogs=tools.catalogs or None,
        )

    def _redactor(self, case_id: uuid.UUID) -> Callable[[str], str]:
        redact = self._redact
        if redact is None:
            return lambda text: text
        return lambda text: redact(case_id, text)

    def _answer_of(self, state: RunState, answering: Answering, turn: AssistantTurn,
                   calls: Sequence[ToolCallRequest], finals: Sequence[ToolCallRequest]
                   ) -> tuple[JsonObject | None, AnswerRejection | None]:
        """The turn's answer, or why it is refused (the model is told: an error result
        for each final-answer call, or a message after a turn in prose)."""
        if not finals:
            if calls:
                return None, None  # still working
            errors = [f"the answer was given as text; it must be given by calling "
                      f"{FINAL_ANSWER}"]
            state.add(UserMessage(feedback(errors)))
            return None, AnswerRejection(answer=turn.text, errors=tuple(errors))
        final = finals[-1]
        given = final.arguments if final.arguments is not None else final.raw_arguments
        answer, errors = answering.validate(final.arguments)
        if calls or len(finals) > 1:
            answer, errors = None, [f"{FINAL_ANSWER} must be the only call of its turn "
                                    "(its other calls were run; answer once they are seen)"]
        if answer is not None:
            return answer, None
        for call in finals:
            state.add(ToolResultMessage(call.id, FINAL_ANSWER, f"ERROR: {feedback(errors)}",
                                        is_error=True))
        return None, AnswerRejection(answer=given, errors=tuple(errors), tool_call_id=final.id)

    async def _decide(self, state: RunState, answering: Answering, answer: JsonObject
                      ) -> AttemptEnd:
        """The checks, then the outcome: a person decides (the agent sends this answer
        to review, a blocking check refused it and the agent has people decide those, or
        the tenant reviews every case), or the answer stands, or a blocking check
        refused it and the case fails ``policy_check_failed`` (never an automated
        decision)."""
        await self._settle(state)  # the cycles the checks read are signed and sent
        checks = answering.judge(state.spec.input, state.recorded_calls(), answer)
        reasons: list[ReviewReason] = [] if answering.review is None else \
            answering.review.reasons(answer, checks)
        if state.spec.review_every_case:
            reasons.append("tenant_policy")
        if reasons:
            return await self._park(state, answer, checks, reasons)
        blocked = refused(checks)
        if blocked:
            return await self._failed(state, "policy_check_failed", "; ".join(
                f"{r.name} {r.version}: {r.detail}" for r in blocked), checks)
        return await self._terminal(state, CaseCompletedPayload(
            cycles_completed=state.cycles, token_totals=state.usage, answer=answer,
            checks=checks, decided_by="agent"))

    async def _park(self, state: RunState, answer: JsonObject, checks: Sequence[CheckResult],
                    reasons: Sequence[ReviewReason]) -> CaseAwaitingReview:
        """End the attempt waiting for a person to decide ``answer``."""
        return await self._wait(state, CaseAwaitingReviewPayload(
            cycles_completed=state.cycles, token_totals=state.usage, answer=answer,
            checks=tuple(checks), review_reasons=tuple(reasons)))

    async def _wait(self, state: RunState, waiting: CaseAwaitingReviewPayload
                    ) -> CaseAwaitingReview:
        """End the attempt waiting for a person: the worker lets go of the case."""
        if state.decided is not None:
            state.decided()
        event = await self._emit(state, waiting)
        state.watch.ended("awaiting_review", None, state.usage)
        assert isinstance(event, CaseAwaitingReview)
        return event

    async def _failed(self, state: RunState, code: Any, message: str,
                      checks: Sequence[CheckResult] = ()) -> TerminalEvent:
        return await self._terminal(
            state,
            CaseFailedPayload(
                cycles_completed=state.cycles,
                token_totals=state.usage,
                reason_code=code,
                message=message,
                model_retries=tuple(state.retries),
                checks=tuple(checks),
            ),
        )

    async def _timed_out(self, state: RunState) -> TerminalEvent:
        limit = state.spec.limits.deadline_seconds
        return await self._terminal(
            state,
            CaseTimedOutPayload(
                cycles_completed=state.cycles,
                token_totals=state.usage,
                deadline_seconds=limit,
                message=f"the case deadline of {limit:g}s passed after {state.cycles} cycles",
                model_retries=tuple(state.retries),
            ),
        )

    async def _cancelled(self, state: RunState, cancel: CancelSignal) -> TerminalEvent:
        return await self._terminal(
            state,
            CaseCancelledPayload(
                cycles_completed=state.cycles,
                token_totals=state.usage,
                while_queued=False,
                reason=cancel.reason,
                cancelled_by=cancel.by,
            ),
        )

    async def _terminal(self, state: RunState, payload: Payload) -> TerminalEvent:
        if state.decided is not None:
            state.decided()
        event = await self._emit(state, payload)
        assert event.is_terminal
        outcome = status_for(event.event_type) or event.event_type
        state.watch.ended(outcome, getattr(payload, "reason_code", None), state.usage)
        return event  # type: ignore[return-value]

    async def _emit(self, state: RunState, payload: Payload) -> Event:
        """Publish after every earlier event is confirmed, and wait for this one too."""
        await self._settle(state)
        event = make_event(state.spec.case_id, state.spec.attempt, state.seq, payload,
                           tenant_id=state.spec.tenant_id)
        await self._sink.emit(event)
        state.seq += 1
        return event

    async def _send(self, state: RunState, payload: Payload) -> Event:
        """Publish an event that a model turn follows. When turns take time (a real
        model), go on at once and let the next ``_settle`` await the confirm, so the
        turn hides the broker's latency; when they take none, an overlap has nothing
        to hide and costs a task, so wait here. Either way the previous event is
        confirmed first, so at most one is ever in flight."""
        if state.model_seconds is not None and state.model_seconds < OVERLAP_MIN_MODEL_SECONDS:
            return await self._emit(state, payload)
        await self._settle(state)
        event = make_event(state.spec.case_id, state.spec.attempt, state.seq, payload,
                           tenant_id=state.spec.tenant_id)
        state.in_flight = asyncio.ensure_future(self._sink.emit(event))
        # A failure is raised where the publish is settled; this only keeps an
        # abandoned attempt's failure from being reported as never retrieved.
        state.in_flight.add_done_callback(_retrieve)
        state.seq += 1
        return event

    @staticmethod
    async def _settle(state: RunState) -> None:
        """Wait until the broker has confirmed every event sent so far; a publish that
        failed raises here."""
        pending, state.in_flight = state.in_flight, None
        if pending is not None:
            await pending



def _sorted_calls(spec: CaseSpec, turn: AssistantTurn) -> tuple[
        tuple[ToolCallRequest, ...], tuple[ToolCallRequest, ...],
        tuple[ToolCallRequest, ...], tuple[ToolCallRequest, ...]]:
    """The turn's calls sorted out: the tools to run, the ``FINAL_ANSWER`` calls (an
    agent with a typed answer), the questions to a person (an agent that may ask; the
    first is asked, and is not run), and every call the turn asked for but its answers."""
    calls: tuple[ToolCallRequest, ...] = turn.tool_calls
    finals: tuple[ToolCallRequest, ...] = ()
    if spec.answering is not None and turn.tool_calls:
        finals = tuple(c for c in turn.tool_calls if c.name == FINAL_ANSWER)
        calls = tuple(c for c in turn.tool_calls if c.name != FINAL_ANSWER)
    asked_in = calls
    questions: tuple[ToolCallRequest, ...] = ()
    if spec.asks_people and not finals:
        questions = tuple(c for c in calls if c.name == ASK_A_PERSON
                          and isinstance((c.arguments or {}).get("question"), str)
                          and (c.arguments or {})["question"].strip())
        calls = tuple(c for c in calls if c not in questions[:1])
    return calls, finals, questions, asked_in


def _reasoning(turn: AssistantTurn) -> str:
    """A turn's reasoning as its cycle records it: the model's thinking, then its text."""
    return turn.text if not turn.thinking else f"{turn.thinking}\n\n{turn.text}".strip()


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


__all__ = ["ReactEngine"]
