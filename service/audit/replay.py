"""Replaying a decision from its record: would the agent's current code, given exactly
what the model said and the tools returned then, decide the same?

A replay runs the case through the engine again, in process, with nothing outside:

- the model's turns come from the record (a real provider's answers cannot be had
  again); a scripted model is the agent's own code, so it runs again;
- worker tools answer with their recorded results (a credit bureau is not asked
  twice); local tools are the agent's code, so they run again;
- the events go to a list, never to the bus or ``event_log``.

Each replayed cycle is compared with the recorded one: the first cycle whose tool
calls (name, arguments, result or error) or reasoning differ is where the replay
diverged. With recorded model turns the decision after a divergence is not known
(the model would have seen other observations); a scripted model decides again.

What is replayed is the agent's part: when a person decided the case, the agent's
answer that waited for them (its first ``CASE_AWAITING_REVIEW``) and the cycles before
it, which the replay reaches and waits on too.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import orjson
from pydantic import ValidationError

from casetrail.adapters.store import StoredEvent
from casetrail.agents import AGENTS
from casetrail.agents.profile import AgentProfile
from casetrail.audit.resume import RecordedEvent, final_chain
from casetrail.contract.events import (
    ADMINISTRATIVE_EVENT_TYPES,
    PARKING_EVENT_TYPE,
    CaseAwaitingReviewPayload,
    CaseCompletedPayload,
    CaseFailedPayload,
    Event,
    Limits,
    ModelRef,
    ReactCyclePayload,
    TokenUsage,
    ToolAttempt,
)
from casetrail.contract.integrity import canonical
from casetrail.engine.case import CaseSpec
from casetrail.engine.chat import AssistantTurn, ChatMessage, ToolSpec
from casetrail.engine.loop import ReactEngine
from casetrail.engine.recorded import recorded_calls, recorded_reply
from casetrail.engine.scripted import ScriptedModel
from casetrail.engine.tools import ToolBox, WorkerCallResult, a2a_capability, mcp_capability
from casetrail.errors import ModelRejected

REPLAY_DEADLINE_SECONDS = 3600.0
"""A replay waits on nothing, so the recorded deadline does not bind it."""


@dataclass(frozen=True)
class Divergence:
    cycle: int
    recorded: str
    replayed: str


@dataclass(frozen=True)
class Replay:
    """One case's replay: ``same`` or ``diverged`` (at ``divergence``), or why it could
    not be replayed (``unreplayable``)."""

    case_id: uuid.UUID
    agent: str
    outcome: str
    recorded_decision: str | None = None
    replayed_decision: str | None = None
    divergence: Divergence | None = None
    reason: str | None = None
    recorded_version: str | None = None
    replayed_version: str | None = None
    refused_by: tuple[str, ...] = ()
    """The blocking checks that refused the replayed answer (a changed check shows the
    past cases it would now refuse)."""

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "caseId": str(self.case_id), "agent": self.agent, "outcome": self.outcome,
            "recordedDecision": self.recorded_decision,
            "replayedDecision": self.replayed_decision,
            "recordedAgentVersion": self.recorded_version,
            "replayedAgentVersion": self.replayed_version}
        if self.divergence is not None:
            shown["divergence"] = {"cycle": self.divergence.cycle,
                                   "recorded": self.divergence.recorded,
                                   "replayed": self.divergence.replayed}
        if self.reason is not None:
            shown["reason"] = self.reason
        if self.refused_by:
            shown["refusedBy"] = list(self.refused_by)
        return shown


class RecordedModel:
    """The recorded model turns, in order: a ``ChatModel`` that asks nobody."""

    def __init__(self, cycles: Sequence[Mapping[str, Any]], name: str) -> None:
        self._turns = [_turn(c) for c in cycles]
        self._name = name
        self._served = 0

    @property
    def name(self) -> str:
        return self._name

    async def request(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
                      ) -> AssistantTurn:
        if self._served >= len(self._turns):
            raise ModelRejected("the record has no further model turn")
        turn = self._turns[self._served]
        self._served += 1
        return turn


def _turn(cycle: Mapping[str, Any]) -> AssistantTurn:
    return AssistantTurn(text=cycle["reasoningText"], tool_calls=recorded_calls(cycle),
                         usage=TokenUsage.model_validate(cycle["tokenUsage"]),
                         finish_reason=cycle.get("finishReason") or "stop",
                         model=cycle.get("model") or "")


def served_by(call: Mapping[str, Any]) -> str:
    """The capability that served a recorded worker tool call: an MCP server's, a remote
    A2A agent's, or the tool's own."""
    if call.get("mcp"):
        return mcp_capability(call["mcp"]["server"])
    if call.get("a2a"):
        return a2a_capability(call["a2a"]["agent"])
    return str(call["toolName"])


@dataclass
class RecordedTools:
    """The worker tools' recorded answers, by ``<case>:<cycle>:<call index>``."""

    answers: dict[str, Mapping[str, Any]]

    async def execute(self, capability: str, args: Mapping[str, Any], *, call_id: str,
                      retry: bool = True) -> WorkerCallResult:
        recorded = self.answers.get(call_id)
        attempt = ToolAttempt(attempt=1, outcome="ok", duration=timedelta(0), worker="replay")
        if recorded is None or served_by(recorded) != capability:
            return WorkerCallResult(error=f"the record has no {capability} call here",
                                    attempts=(attempt,))
        if recorded.get("error"):
            return WorkerCallResult(error=recorded["error"], attempts=(attempt,))
        return WorkerCallResult(result=recorded_reply(recorded), attempts=(attempt,))


@dataclass
class KeptEvents:
    """The replay's events: kept in a list, never published."""

    events: list[Event] = field(default_factory=list)

    async def emit(self, event: Event) -> None:
        self.events.append(event)


def _calls(cycle: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The calls as the record holds them: arguments and results in canonical JSON (the
    bytes that were signed: 25000.0 and 25000 are the same number there)."""
    return [(c["toolName"], canonical(c.get("toolArgs")), canonical(c.get("toolResult")),
             c.get("error")) for c in cycle.get("toolCalls") or []]


def _describe(cycle: Mapping[str, Any] | None) -> str:
    if cycle is None:
        return "no such cycle"
    calls = cycle.get("toolCalls") or []
    if not calls:
        return f"the answer: {cycle['reasoningText'][:300]}"
    return "; ".join(
        f"{c['toolName']}({orjson.dumps(c.get('toolArgs')).decode()}) -> "
        + (f"error {c['error']}" if c.get("error")
           else orjson.dumps(c.get("toolResult")).decode())
        for c in calls)


def first_divergence(recorded: Sequence[Mapping[str, Any]],
                     replayed: Sequence[Mapping[str, Any]]) -> Divergence | None:
    for index in range(max(len(recorded), len(replayed))):
        old = recorded[index] if index < len(recorded) else None
        new = replayed[index] if index < len(replayed) else None
        if old is None or new is None or _calls(old) != _calls(new) \
                or old["reasoningText"] != new["reasoningText"]:
            return Divergence(index, _describe(old), _describe(new))
    return None


def as_validated(agent: AgentProfile, case_input: dict[str, Any]) -> dict[str, Any]:
    """The input as the worker had it: through the agent's input model, as the API
    validated it (the record's canonical JSON writes 25000.0 as 25000)."""
    try:
        validated = agent.input_model.model_validate(case_input)
    except ValidationError:  # a placeholder where a sensitive value had a format
        return case_input
    dumped: dict[str, Any] = validated.model_dump(mode="json", by_alias=True)
    return dumped


def decision_of(answer: Any) -> str | None:
    value = answer.get("decision") if isinstance(answer, Mapping) else None
    return None if value is None else str(value)


async def replay_case(case_id: uuid.UUID, events: Sequence[RecordedEvent],
                      agents: Mapping[str, AgentProfile] = AGENTS) -> Replay:
    """Replay one case from its stored events (every attempt, in order)."""
    found = _what_to_replay(case_id, events, agents)
    if isinstance(found, Replay):
        return found
    agent, decided, cycles = found
    started = events[0].payload
    recorded_decision = decision_of(decided.payload.get("answer"))
    model_ref = ModelRef.model_validate(started["model"])
    model = ScriptedModel(agent.script, name=model_ref.name) \
        if model_ref.provider == "scripted" and agent.script is not None \
        else RecordedModel(cycles, model_ref.name)
    answers = {f"{case_id}:{cycle['cycleIndex']}:{i}": call for cycle in cycles
               for i, call in enumerate(cycle.get("toolCalls") or [])}
    kept = KeptEvents()
    await ReactEngine(kept).run(_replay_spec(case_id, agent, started, model_ref), model,
                                ToolBox(agent.tools, RecordedTools(answers)))
    replayed = [e.payload.model_dump(mode="json", by_alias=True) for e in kept.events
                if isinstance(e.payload, ReactCyclePayload)]
    replayed_decision, refused_by = _replayed_outcome(kept, decided)
    divergence = first_divergence(cycles, replayed)
    if divergence is not None and not isinstance(model, ScriptedModel):
        replayed_decision = None  # the recorded model never saw what the code gives now
    same = divergence is None and replayed_decision == recorded_decision
    return Replay(case_id, str(started.get("agent")), "same" if same else "diverged",
                  recorded_decision,
                  replayed_decision, divergence,
                  recorded_version=started.get("agentVersion"), replayed_version=agent.version,
                  refused_by=refused_by)


def _what_to_replay(case_id: uuid.UUID, events: Sequence[RecordedEvent],
                    agents: Mapping[str, AgentProfile]
                    ) -> Replay | tuple[AgentProfile, RecordedEvent, list[Mapping[str, Any]]]:
    """The agent, the event holding its own decision and the cycles that led to it; or
    why the case cannot be replayed."""
    if not events or events[0].event_type != "CASE_STARTED":
        return Replay(case_id, "?", "unreplayable", reason="no CASE_STARTED in the record")
    name = str(events[0].payload.get("agent"))
    # The decision is the last non-administrative event (an erasure may follow it).
    terminal = [e for e in events if e.event_type not in ADMINISTRATIVE_EVENT_TYPES][-1]
    if terminal.event_type not in ("CASE_COMPLETED", PARKING_EVENT_TYPE):
        return Replay(case_id, name, "unreplayable",
                      reason=f"the case ended {terminal.event_type}, not with a decision")
    agent = agents.get(name)
    if agent is None:
        return Replay(case_id, name, "unreplayable", reason=f"no agent {name!r} here")
    # The agent's own decision: the one a person was asked about, if one was.
    waited = next((e for e in events if e.event_type == PARKING_EVENT_TYPE), None)
    cycles = final_chain(events)
    if waited is None:
        return agent, terminal, cycles
    return agent, waited, cycles[: int(waited.payload["cyclesCompleted"])]


def _replay_spec(case_id: uuid.UUID, agent: AgentProfile, started: Mapping[str, Any],
                 model_ref: ModelRef) -> CaseSpec:
    """The case as it started, under the agent's code now, within the replay's deadline."""
    recorded_limits = Limits.model_validate(started["limits"])
    return CaseSpec(
        case_id=case_id, attempt=1, agent=agent.name, system_prompt=agent.system_prompt,
        input=as_validated(agent, started["input"]), model=model_ref,
        agent_version=agent.version,
        limits=Limits(max_cycles=recorded_limits.max_cycles,
                      deadline_seconds=REPLAY_DEADLINE_SECONDS,
                      max_answer_retries=recorded_limits.max_answer_retries),
        context_budget=agent.context_budget_tokens, answering=agent.answering)


def _replayed_outcome(kept: KeptEvents, decided: RecordedEvent
                      ) -> tuple[str | None, tuple[str, ...]]:
    """The replay's decision (none when its checks refuse what the record's did not, or
    the other way round) and the blocking checks that refused it."""
    end = kept.events[-1].payload
    replayed_decision = decision_of(end.answer) if isinstance(
        end, CaseCompletedPayload | CaseAwaitingReviewPayload) else None
    refused_by = tuple(f"{c.name} {c.version}" for c in end.checks if c.blocking and
                       not c.passed) if isinstance(
        end, CaseFailedPayload | CaseAwaitingReviewPayload) else ()
    recorded_refusal = tuple(
        f"{c['name']} {c['version']}" for c in decided.payload.get("checks") or ()
        if c.get("blocking") and not c.get("passed"))
    if refused_by != recorded_refusal:
        replayed_decision = None  # refused now: it would not stand as the agent's
    return replayed_decision, refused_by


def recorded(stored: Sequence[StoredEvent]) -> list[RecordedEvent]:
    return [RecordedEvent(e.attempt, e.seq, e.event_type, e.payload, e.occurred_at)
            for e in stored]


async def replay_many(cases: Mapping[uuid.UUID, Sequence[RecordedEvent]],
                      agents: Mapping[str, AgentProfile] = AGENTS) -> list[Replay]:
    """Replay many cases, one after the other (none waits on anything outside)."""
    return [await replay_case(case_id, events, agents) for case_id, events in cases.items()]
