"""Testing your agent without a stack: ``run_case`` runs one case of it in this process,
as the worker would (the same engine, the agent's answer schema and checks), with its
scripted brain or a model you give, its local tools, and its own capabilities called
in process instead of over the bus. Nothing is published or stored."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from casetrail.a2a.capabilities import a2a_capabilities
from casetrail.agents.authoring import Agent, DeclarationError
from casetrail.agents.profile import AgentProfile
from casetrail.config import A2aAgent, McpServer, ModelEndpoint, get_settings
from casetrail.contract.events import (
    PARKING_EVENT_TYPE,
    CaseStatus,
    Event,
    ModelRef,
    new_case_id,
    status_for,
)
from casetrail.engine.case import CaseSpec
from casetrail.engine.chat import ChatModel
from casetrail.engine.loop import ReactEngine
from casetrail.engine.scripted import ScriptedModel
from casetrail.engine.tools import InProcessWorkerRuntime, ToolBox
from casetrail.mcp import Catalogs
from casetrail.mcp.capabilities import mcp_capabilities
from casetrail.providers import ModelFactory, model_problem


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
                   model: ChatModel | ModelRef | None = None,
                   mcp_servers: Sequence[Mapping[str, Any]] = (),
                   endpoints: Sequence[Mapping[str, Any]] | None = None,
                   a2a_agents: Sequence[Mapping[str, Any]] = ()) -> CaseRun:
    """Run one case of ``agent`` on ``case_input`` (validated against its input model)
    to its terminal event, or to the wait for a person its ``review`` asks for.

    ``model``: none for the agent's scripted brain; a ``ModelRef`` for a real model —
    ``ModelRef(provider="openai", name=..., endpoint="local")`` speaks to a configured
    endpoint (``endpoints``: ``CASETRAIL_MODEL_ENDPOINTS`` entries, e.g. a local
    OpenAI-compatible server; by default this process's settings), with the same client
    a worker uses; or any ``ChatModel`` of your own. ``mcp_servers`` are the MCP servers
    its ``McpTool``s need, as the operator would configure them
    (``CASETRAIL_MCP_SERVERS`` entries): each is started (stdio) or reached (http) by
    this process, and its catalog read, as a capability worker would. ``a2a_agents`` are
    the remote A2A agents its ``A2aTool``s ask (``CASETRAIL_A2A_AGENTS`` entries, each
    with its pinned ``cardDigest``), called from this process as a capability worker
    would call them."""
    profile = agent.profile() if isinstance(agent, Agent) else agent
    ref = profile.default_model
    factory: ModelFactory | None = None
    if isinstance(model, ModelRef):
        settings = get_settings() if endpoints is None else get_settings().model_copy(
            update={"model_endpoints": [ModelEndpoint.model_validate(e) for e in endpoints]})
        if problem := model_problem(model, settings):
            raise DeclarationError(f"run_case: model.{problem[0]}: {problem[1]}")
        ref, factory = model, ModelFactory(settings)
        model = factory(model, profile)
    if model is None:
        if profile.script is None:
            raise DeclarationError(f"agent {profile.name!r} has no script: give run_case a "
                                   "model")
        model = ScriptedModel(profile.script)
    try:
        return await _run(profile, case_input, model, ref, mcp_servers, a2a_agents)
    finally:
        if factory is not None:
            await factory.aclose()


async def _run(profile: AgentProfile, case_input: dict[str, Any], model: ChatModel,
               ref: ModelRef, mcp_servers: Sequence[Mapping[str, Any]],
               a2a_agents: Sequence[Mapping[str, Any]]) -> CaseRun:
    validated = profile.input_model.model_validate(case_input)
    spec = CaseSpec(
        case_id=new_case_id(), attempt=1, agent=profile.name,
        system_prompt=profile.system_prompt,
        input=validated.model_dump(mode="json", by_alias=True),
        limits=profile.default_limits, model=ref,
        agent_version=profile.version, context_budget=profile.context_budget_tokens,
        answering=profile.answering, agent_digest=profile.digest)
    run = CaseRun()
    servers = [McpServer.model_validate(s) for s in mcp_servers]
    served = mcp_capabilities(servers)
    remote = a2a_capabilities([A2aAgent.model_validate(a) for a in a2a_agents])
    runtime = InProcessWorkerRuntime({capability.name: capability for capability in [
        *profile.capabilities, *served, *remote]})
    try:
        # no worker read the catalogs ahead: the case waits for each server to start,
        # as long as the server's own timeout, so a loaded machine does not change it
        first_read = max((s.timeout_seconds for s in servers), default=0.0) + 2
        resolved, catalogs = await Catalogs(runtime, first_read=first_read).offer(profile.tools)
        tools = ToolBox(resolved, runtime, catalogs=catalogs)
        await ReactEngine(run).run(spec, model, tools)
    finally:
        for capability in served:
            if capability.close is not None:
                await capability.close()
    return run
