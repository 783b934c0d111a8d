"""Testing your agent without a stack: ``run_case`` runs one case of it in this process,
as the worker would (the same engine, the agent's answer schema and checks), with its
scripted brain or a model you give, its local tools, and its own capabilities called
in process instead of over the bus. Nothing is published or stored."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from casetrail.agents.authoring import Agent, DeclarationError
from casetrail.agents.profile import AgentProfile
from casetrail.config import McpServer
from casetrail.contract.events import PARKING_EVENT_TYPE, CaseStatus, Event, status_for
from casetrail.engine.case import CaseSpec
from casetrail.engine.chat import ChatModel
from casetrail.engine.loop import ReactEngine
from casetrail.engine.scripted import ScriptedModel
from casetrail.engine.tools import InProcessWorkerRuntime, ToolBox
from casetrail.mcp import Catalogs, mcp_capabilities


@dataclass
class CaseRun:
    """One case's events, as the trail would hold them (before sensitive values are
    replaced by their placeholders)."""

    events: list[Event] = field(default_factory=list)

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    @property
    def status(self) -> str:
        """``completed``, ``failed``, ``timed_out`` or ``cancelled``; ``awaiting_review``
        when a person decides the agent's answer (the agent's ``review``)."""
        last = self.events[-1].event_type
        if last == PARKING_EVENT_TYPE:
            return CaseStatus.AWAITING_REVIEW.value
        return str(status_for(last))

    @property
    def terminal(self) -> dict[str, Any]:
        """The last event's payload, as JSON: the terminal event's, or the wait for a
        person's (its answer and checks)."""
        return self.events[-1].payload.model_dump(mode="json", by_alias=True)

    @property
    def answer(self) -> dict[str, Any] | None:
        answer: dict[str, Any] | None = self.terminal.get("answer")
        return answer

    @property
    def checks(self) -> list[dict[str, Any]]:
        checks: list[dict[str, Any]] = self.terminal.get("checks", [])
        return checks

    @property
    def cycles(self) -> list[dict[str, Any]]:
        return [e.payload.model_dump(mode="json", by_alias=True) for e in self.events
                if e.event_type == "REACT_CYCLE"]


async def run_case(agent: Agent | AgentProfile, case_input: dict[str, Any], *,
                   model: ChatModel | None = None,
                   mcp_servers: Sequence[Mapping[str, Any]] = ()) -> CaseRun:
    """Run one case of ``agent`` on ``case_input`` (validated against its input model)
    to its terminal event, or to the wait for a person its ``review`` asks for.
    ``mcp_servers`` are the MCP servers its ``McpTool``s need, as the operator would
    configure them (``CASETRAIL_MCP_SERVERS`` entries): each is started (stdio) or
    reached (http) by this process, and its catalog read, as a capability worker would."""
    profile = agent.profile() if isinstance(agent, Agent) else agent
    if model is None:
        if profile.script is None:
            raise DeclarationError(f"agent {profile.name!r} has no script: give run_case a "
                                   "model")
        model = ScriptedModel(profile.script)
    validated = profile.input_model.model_validate(case_input)
    spec = CaseSpec(
        case_id=uuid.uuid4(), attempt=1, agent=profile.name,
        system_prompt=profile.system_prompt,
        input=validated.model_dump(mode="json", by_alias=True),
        limits=profile.default_limits, model=profile.default_model,
        agent_version=profile.version, context_budget=profile.context_budget_tokens,
        answering=profile.answering, agent_digest=profile.digest)
    run = CaseRun()
    served = mcp_capabilities([McpServer.model_validate(s) for s in mcp_servers])
    runtime = InProcessWorkerRuntime(
        {capability.name: capability for capability in [*profile.capabilities, *served]})
    try:
        tools = ToolBox(await Catalogs(runtime).resolve(profile.tools), runtime)
        await ReactEngine(run).run(spec, model, tools)
    finally:
        for capability in served:
            if capability.close is not None:
                await capability.close()
    return run
