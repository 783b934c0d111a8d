"""A backtest: how a challenger — the agent's code as installed now, with a model of the
caller's choosing — would have decided cases already on file (docs/backtests.md).

For each recorded case the agent decided, the challenger runs in process from the
recorded input, with nothing outside:

- the model is the one the backtest names (a configured endpoint, a real provider, or
  the agent's scripted brain);
- a worker tool call whose tool and arguments match a call the record holds answers
  with the recorded result (the credit bureau is not asked again), each recorded call
  once; a call the record does not hold is refused (an error the challenger sees,
  counted and listed) — the record is the only world a backtest may touch;
- the events go to a list, never to the bus, ``event_log`` or the cases table.

Its comparison: the champion's decision (the agent's own, the one a person was asked
about if one was), the challenger's, and, for a reviewed case, the reviewer's final
decision as the label; a decision matrix, agreement with the reviewers for each side,
the cases whose decision changed, the calls the record could not answer, tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from casetrail.agents.profile import AgentProfile
from casetrail.audit.evidence import Evidence
from casetrail.audit.replay import (
    REPLAY_DEADLINE_SECONDS,
    KeptEvents,
    as_validated,
    decision_of,
    recorded,
    served_by,
)
from casetrail.audit.resume import RecordedEvent, final_chain
from casetrail.contract.events import (
    ADMINISTRATIVE_EVENT_TYPES,
    PARKING_EVENT_TYPE,
    CaseAwaitingReviewPayload,
    CaseCompletedPayload,
    Limits,
    ModelRef,
    ReactCyclePayload,
    ToolAttempt,
)
from casetrail.contract.integrity import canonical
from casetrail.engine.case import CaseSpec
from casetrail.engine.chat import ChatModel
from casetrail.engine.loop import ReactEngine
from casetrail.engine.recorded import recorded_reply
from casetrail.engine.scripted import ScriptedModel
from casetrail.engine.tools import (
    ToolBox,
    ToolSource,
    WorkerCallResult,
    WorkerRuntime,
    WorkerTool,
)
from casetrail.mcp import Catalogs


def challenger_model(models: Callable[[ModelRef, AgentProfile], ChatModel],
                     profile: AgentProfile, ref: ModelRef) -> ChatModel:
    """The challenger's model: the agent's scripted brain for ``scripted``, else the
    configured provider's."""
    if ref.provider == "scripted" and profile.script is not None:
        return ScriptedModel(profile.script, name=ref.name)
    return models(ref, profile)


NOT_IN_RECORD = "the record holds no such call, and a backtest asks no tool (refused)"


def _mcp_asked(tool: str | None, arguments: Mapping[str, Any] | None) -> bytes:
    """An MCP server's call as comparable bytes: which of its tools, with what."""
    return canonical({"tool": tool, "arguments": arguments or {}})


def _asked(capability: str, args: Mapping[str, Any]) -> bytes:
    """What a worker tool was asked, as comparable bytes: an MCP server's or a remote
    agent's request carries the model's arguments inside (``arguments``); an MCP
    server's also names which of its tools."""
    if capability.startswith("mcp-"):
        return _mcp_asked(args.get("tool"), args.get("arguments"))
    inner = args.get("arguments") if capability.startswith("a2a-") else args
    return canonical(inner if inner is not None else {})


@dataclass
class RecordedAnswers:
    """A ``WorkerRuntime`` that answers from a case's recorded calls, matched by tool and
    arguments, each once; anything else is refused and noted."""

    tools: Sequence[ToolSource]
    """The challenger's tools (an MCP server's described by its catalog when one was
    read: the server's ``readOnlyHint`` makes its tool read-only)."""
    calls: list[Mapping[str, Any]]
    unanswered: list[str] = field(default_factory=list)
    live: WorkerRuntime | None = None
    """Under the tool policy ``live``: what asks a read-only tool the call the record
    lacks (every such call counted and listed in ``asked_live``)."""
    asked_live: list[str] = field(default_factory=list)
    _used: set[int] = field(default_factory=set)

    @functools.cached_property
    def _read_only(self) -> frozenset[tuple[str, str | None]]:
        """The read-only tools by capability and, for an MCP server's, the tool's name
        on the server (one capability serves all of a server's tools)."""
        return frozenset((t.capability, t.mcp.tool if t.mcp else None) for t in self.tools
                         if isinstance(t, WorkerTool) and t.read_only)

    def _recorded_args(self, call: Mapping[str, Any]) -> bytes:
        """The recorded arguments as the runtime is handed them now: through the tool's
        argument model when it has one (defaults filled in, names by alias)."""
        args = call.get("toolArgs") or {}
        if call.get("mcp"):
            return _mcp_asked(call["mcp"]["tool"], args)
        tool = next((t for t in self.tools if isinstance(t, WorkerTool)
                     and t.name == call["toolName"]), None)
        if tool is not None and tool.args_model is not None:
            with contextlib.suppress(ValueError):  # as recorded, if it no longer validates
                args = tool.args_model.model_validate(args).model_dump(mode="json",
                                                                       by_alias=True)
        return canonical(args)

    async def execute(self, capability: str, args: Mapping[str, Any], *, call_id: str,
                      retry: bool = True) -> WorkerCallResult:
        attempt = ToolAttempt(attempt=1, outcome="ok", duration=timedelta(0),
                              worker="backtest")
        asked = _asked(capability, args)
        for index, call in enumerate(self.calls):
            if index in self._used or served_by(call) != capability \
                    or self._recorded_args(call) != asked:
                continue
            self._used.add(index)
            if call.get("error"):
                return WorkerCallResult(error=call["error"], attempts=(attempt,))
            return WorkerCallResult(result=recorded_reply(call), attempts=(attempt,))
        tool = args.get("tool") if capability.startswith("mcp-") else None
        if self.live is not None and (capability, tool) in self._read_only:
            self.asked_live.append(f"{capability} {asked.decode()}")
            return await self.live.execute(capability, args, call_id=f"backtest:{call_id}",
                                           retry=retry)
        self.unanswered.append(f"{capability} {asked.decode()}")
        return WorkerCallResult(error=NOT_IN_RECORD, attempts=(attempt,))


@dataclass(frozen=True)
class CaseOutcome:
    """One case of a backtest."""

    case_id: uuid.UUID
    champion: str | None
    challenger: str | None
    label: str | None = None
    """A person's final decision, when one reviewed the case."""
    unanswered: tuple[str, ...] = ()
    tokens: int = 0
    changed_fields: tuple[str, ...] = ()
    problem: str | None = None
    champion_digest: str | None = None
    """The ``agentDigest`` the champion decided the case with (its CASE_STARTED)."""
    answers: tuple[Any, Any] = (None, None)
    """The champion's answer and the challenger's, side by side."""
    run: tuple[dict[str, Any], ...] = ()
    """The challenger's cycles, kept for a case whose decision changed (the drill-down)."""
    asked_live: tuple[str, ...] = ()
    """Calls the record lacked that a read-only tool answered (the tool policy ``live``)."""

    @property
    def changed(self) -> bool:
        return self.problem is None and self.champion != self.challenger

    def as_json(self) -> dict[str, Any]:
        return {"caseId": str(self.case_id), "championDigest": self.champion_digest,
                "champion": self.champion,
                "challenger": self.challenger, "label": self.label,
                "changed": self.changed,
                "changedFields": list(self.changed_fields),
                "answers": {"champion": self.answers[0], "challenger": self.answers[1]},
                "unanswered": list(self.unanswered), "tokens": self.tokens,
                **({"askedLive": list(self.asked_live)} if self.asked_live else {}),
                **({"run": list(self.run)} if self.run else {}),
                **({"problem": self.problem} if self.problem else {})}


def decision_events(events: Sequence[RecordedEvent]) -> tuple[RecordedEvent, RecordedEvent | None]:
    """The case's last decision event, and the wait for a review before it, if any."""
    terminal = [e for e in events if e.event_type not in ADMINISTRATIVE_EVENT_TYPES][-1]
    waited = next((e for e in events if e.event_type == PARKING_EVENT_TYPE), None)
    return terminal, waited


async def challenger_tools(agent: AgentProfile, catalogs: Catalogs | None
                           ) -> list[ToolSource]:
    """The agent's tools as the challenger is offered them: with ``catalogs`` (the tool
    policy ``live``), an MCP server's tool described by the server's catalog as a case
    start would (its schema, its description, whether it is read-only); one the catalog
    cannot describe now stays as declared, since the record may still answer it."""
    if catalogs is None:
        return list(agent.tools)
    described = {t.name: t for t in await catalogs.resolve(agent.tools)
                 if isinstance(t, WorkerTool) and t.mcp and t.mcp.unavailable is None}
    return [described.get(t.name, t) for t in agent.tools]


async def backtest_case(case_id: uuid.UUID, events: Sequence[RecordedEvent],
                        agent: AgentProfile, model: ChatModel, model_ref: ModelRef,
                        live: Catalogs | None = None) -> CaseOutcome:
    """Run the challenger on one recorded case (``live``: the tool policy ``live``, with
    the MCP servers' catalogs read through the worker's runtime and kept across cases)."""
    if not events or events[0].event_type != "CASE_STARTED":
        return CaseOutcome(case_id, None, None, problem="no CASE_STARTED in the record")
    started = events[0].payload
    terminal, waited = decision_events(events)
    decided = terminal if waited is None else waited
    champion_answer = decided.payload.get("answer")
    label = decision_of(terminal.payload.get("answer")) \
        if waited is not None and terminal.event_type == "CASE_COMPLETED" else None
    calls = [call for cycle in final_chain(events) for call in cycle.get("toolCalls") or []]
    tools = await challenger_tools(agent, live)
    answers = RecordedAnswers(tools, calls, live=None if live is None else live.runtime)
    limits = Limits.model_validate(started["limits"])
    spec = CaseSpec(
        case_id=case_id, attempt=1, agent=agent.name, system_prompt=agent.system_prompt,
        input=as_validated(agent, started["input"]), model=model_ref,
        agent_version=agent.version,
        limits=Limits(max_cycles=limits.max_cycles, deadline_seconds=REPLAY_DEADLINE_SECONDS,
                      max_answer_retries=limits.max_answer_retries),
        context_budget=agent.context_budget_tokens, answering=agent.answering)
    kept = KeptEvents()
    await ReactEngine(kept).run(spec, model, ToolBox(tools, answers))
    end = kept.events[-1].payload
    answer = end.answer if isinstance(end, CaseCompletedPayload | CaseAwaitingReviewPayload) \
        else None
    tokens = sum(e.payload.token_usage.input_tokens + e.payload.token_usage.output_tokens
                 for e in kept.events if isinstance(e.payload, ReactCyclePayload))
    changed = tuple(sorted(
        key for key in {*(champion_answer or {}), *(answer or {})}
        if canonical((champion_answer or {}).get(key)) != canonical((answer or {}).get(key))))
    outcome = CaseOutcome(case_id, decision_of(champion_answer), decision_of(answer), label,
                          tuple(answers.unanswered), tokens, changed,
                          None if answer is not None else f"the challenger ended "
                          f"{kept.events[-1].event_type} without an answer",
                          started.get("agentDigest"), (champion_answer, answer),
                          asked_live=tuple(answers.asked_live))
    if not outcome.changed:
        return outcome
    return replace(outcome, run=tuple(
        e.payload.model_dump(mode="json", by_alias=True, exclude_none=True)
        for e in kept.events if isinstance(e.payload, ReactCyclePayload)))


@dataclass(frozen=True)
class Budget:
    """What a backtest may spend: cases run at once, the challenger's tokens, seconds.
    Once tokens or time are spent no further case starts; those running finish."""

    concurrency: int = 4
    max_tokens: int | None = None
    max_seconds: float | None = None


@dataclass
class Run:
    """A backtest's cases as they were run, those left out because their record does not
    verify (each with why), and why it stopped early, if it did."""

    outcomes: list[CaseOutcome] = field(default_factory=list)
    stopped: str | None = None
    seconds: float = 0.0
    left_out: list[tuple[uuid.UUID, str]] = field(default_factory=list)

    def left_out_json(self) -> list[dict[str, str]]:
        return [{"caseId": str(case_id), "why": why} for case_id, why in self.left_out]


Verify = Callable[[uuid.UUID], Awaitable[str | None]]
"""Why a case's record may not be scored (``None``: it verifies)."""


def records_verified(evidence: Evidence) -> Verify:
    """Only a case whose stored record verifies (chain, signatures, columns against the
    signed bytes, its leaves) is scored: a gutted or altered record would be scored as
    what it was made to say (docs/backtests.md, "The cases")."""
    async def why_not(case_id: uuid.UUID) -> str | None:
        report = await evidence.verify(case_id)
        if report is None:
            return "neither stored nor in the log"
        if report.verified:
            return None
        return "its record does not verify: " + ", ".join(
            sorted({p.code for p in report.problems}))
    return why_not


async def run_backtest(ids: Sequence[uuid.UUID],
                       trails: Callable[[Sequence[uuid.UUID]],
                                        Awaitable[Mapping[uuid.UUID, Any]]],
                       agent: AgentProfile, model: ChatModel, model_ref: ModelRef,
                       budget: Budget, verify: Verify,
                       progress: Callable[[int, int], None] | None = None,
                       live: WorkerRuntime | None = None) -> Run:
    """The challenger over the cases ``ids`` whose record ``verify`` passes (their trails
    read ``trails`` a chunk at a time; the others left out, named), ``budget.concurrency``
    at once; ``progress(done, total)`` after each case."""
    run, began = Run(), time.monotonic()
    catalogs = None if live is None else Catalogs(live)  # read once, for every case
    spent = 0
    gate = asyncio.Semaphore(budget.concurrency)

    def exhausted() -> str | None:
        if budget.max_tokens is not None and spent >= budget.max_tokens:
            return f"the token budget ({budget.max_tokens:,}) is spent"
        if budget.max_seconds is not None and time.monotonic() - began >= budget.max_seconds:
            return f"the time budget ({budget.max_seconds:g} s) is spent"
        return None

    async def one(case_id: uuid.UUID, trail: Any) -> None:
        nonlocal spent
        async with gate:
            if (why := exhausted()) is not None:
                run.stopped = run.stopped or why
                return
            if (unverified := await verify(case_id)) is not None:
                run.left_out.append((case_id, unverified))
            else:
                outcome = await backtest_case(case_id, recorded(trail), agent, model,
                                              model_ref, catalogs)
                spent += outcome.tokens
                run.outcomes.append(outcome)
            if progress is not None:
                progress(len(run.outcomes) + len(run.left_out), len(ids))

    for chunk in range(0, len(ids), CHUNK):
        if run.stopped:
            break
        asked = ids[chunk:chunk + CHUNK]
        read = await trails(asked)
        # A case whose every event is gone is still checked, and so named, not skipped.
        await asyncio.gather(*(one(case_id, read.get(case_id, [])) for case_id in asked))
    order = {case_id: index for index, case_id in enumerate(ids)}
    run.outcomes.sort(key=lambda o: order[o.case_id])
    run.left_out.sort(key=lambda left: order[left[0]])
    run.seconds = time.monotonic() - began
    return run


CHUNK = 500
"""Trails read a query."""


def summary(outcomes: Sequence[CaseOutcome]) -> dict[str, Any]:
    """What people read of a backtest: the decision matrix (champion by challenger), each
    side's agreement with the reviewers on reviewed cases, the cases whose decision
    changed, the calls the record could not answer, tokens."""
    matrix: Counter[tuple[str, str]] = Counter(
        (str(o.champion), str(o.challenger)) for o in outcomes)
    labelled = [o for o in outcomes if o.label is not None]

    def agreement(side: str) -> float | None:
        if not labelled:
            return None
        agreed = sum(1 for o in labelled if getattr(o, side) == o.label)
        return round(agreed / len(labelled), 4)

    return {
        "cases": len(outcomes),
        "matrix": [{"champion": a, "challenger": b, "cases": n}
                   for (a, b), n in sorted(matrix.items())],
        "reviewed": len(labelled),
        "agreementWithReviewers": {"champion": agreement("champion"),
                                   "challenger": agreement("challenger")},
        "changed": [str(o.case_id) for o in outcomes if o.changed],
        "unansweredCalls": sum(len(o.unanswered) for o in outcomes),
        "liveCalls": sum(len(o.asked_live) for o in outcomes),
        "tokens": sum(o.tokens for o in outcomes),
        "results": [o.as_json() for o in outcomes]}
