"""The authoring API: how a team declares its own agent and its capabilities, in its own
package, and casetrail runs them (re-exported, stable, by the ``casetrail`` package;
docs/agents.md).

    from casetrail import Agent, LocalTool, McpTool, WorkerTool, capability

    @capability("overdraft-history")
    async def overdraft_history(args: HistoryArgs) -> dict: ...

    OVERDRAFT = Agent(
        name="overdraft-review", version="1.0.0", description="...",
        instructions="You review overdraft requests...", input=OverdraftRequest,
        answer=OverdraftDecision,
        tools=[WorkerTool("overdraft-history", args=HistoryArgs, description="..."),
               LocalTool(fee_for), McpTool("bank-records", "standing_orders")],
        model=ModelRef(provider="openai", name="gpt-4o-mini"))

A package offers them through the entry-point groups ``casetrail.agents`` and
``casetrail.capabilities`` (``service/agents/__init__.py`` finds them), or a
deployment names them in ``CASETRAIL_AGENTS=module:attr,...``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

from pydantic import BaseModel, Field

from casetrail.agents.profile import AgentProfile
from casetrail.contract.events import Limits, ModelRef
from casetrail.engine import tools as engine_tools
from casetrail.engine.answers import ENGINE_TOOLS, Check, Review
from casetrail.engine.scripted import ScriptFn
from casetrail.engine.tools import Capability, ToolSource
from casetrail.errors import PermanentError

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

ArgsT = TypeVar("ArgsT", bound=BaseModel)


class DeclarationError(PermanentError):
    """An agent or a capability declared in a way casetrail cannot run."""


def _args_model(fn: Callable[..., Any], what: str) -> type[BaseModel]:
    """The pydantic model of ``fn``'s one parameter."""
    parameters = list(inspect.signature(fn).parameters.values())
    hints = get_type_hints(fn)
    if len(parameters) != 1 or not (isinstance(model := hints.get(parameters[0].name), type)
                                    and issubclass(model, BaseModel)):
        raise DeclarationError(f"{what} {fn.__qualname__} must take one argument annotated "
                               "with a pydantic model (its arguments)")
    return model


def LocalTool(fn: Callable[[Any], Any], *, name: str | None = None,
              description: str | None = None) -> engine_tools.LocalTool[Any]:
    """A plain function (sync or async) as a tool called in process: its arguments are
    the pydantic model it takes, its name the function's (``-`` for ``_``), its
    description the first paragraph of its docstring."""
    tool_name = name or fn.__name__.replace("_", "-")
    if not TOOL_NAME.match(tool_name):
        raise DeclarationError(f"tool name {tool_name!r} must match {TOOL_NAME.pattern}")
    text = description or (inspect.getdoc(fn) or "").split("\n\n", 1)[0].replace("\n", " ")
    if not text:
        raise DeclarationError(f"tool {tool_name!r} needs a description (or a docstring)")
    return engine_tools.LocalTool(tool_name, text, _args_model(fn, "tool"), fn)


def WorkerTool(capability: str, *, args: type[BaseModel], description: str,
               name: str | None = None, read_only: bool = False) -> engine_tools.WorkerTool:
    """A tool run by a capability worker through the bus (retries, timeout, audit):
    ``capability`` names what serves it, ``args`` its arguments; ``read_only`` when it
    changes nothing where it runs (a lookup), so a backtest may ask it live."""
    if not NAME.match(capability):
        raise DeclarationError(f"capability name {capability!r} must match {NAME.pattern}")
    return engine_tools.WorkerTool(name or capability, description, capability, args,
                                   read_only=read_only)


def McpTool(server: str, tool: str, *, name: str | None = None,
            read_only: bool = False) -> engine_tools.WorkerTool:
    """A tool of an MCP server the operator configured (``CASETRAIL_MCP_SERVERS``): a
    WorkerTool served by that server's capability worker. Its description and argument
    schema are the server's own, read from the catalog when a case starts; the model
    sees it as ``<server>_<tool>`` unless ``name`` says otherwise. It is read-only (a
    backtest may ask it live) when ``read_only`` says so or the server annotates it
    ``readOnlyHint``."""
    if not re.match(engine_tools.MCP_SERVER_NAME, server):
        raise DeclarationError(f"MCP server name {server!r} must match "
                               f"{engine_tools.MCP_SERVER_NAME}")
    if not tool:
        raise DeclarationError(f"MCP server {server!r}: name the tool")
    tool_name = name or engine_tools.mcp_tool_name(server, tool)
    if not TOOL_NAME.match(tool_name):
        raise DeclarationError(f"tool name {tool_name!r} must match {TOOL_NAME.pattern}")
    return engine_tools.WorkerTool(tool_name, f"{tool} (from the MCP server {server})",
                                   engine_tools.mcp_capability(server),
                                   mcp=engine_tools.McpBinding(server, tool),
                                   read_only=read_only)


class A2aText(BaseModel):
    """What the model gives an A2A agent's tool declared without an input model: the
    message's text."""

    text: str = Field(min_length=1, max_length=100_000,
                      description="What to ask the remote agent, in words.")


def A2aTool(agent: str, skill: str | None = None, *, input: type[BaseModel] | None = None,
            description: str | None = None, name: str | None = None
            ) -> engine_tools.WorkerTool:
    """A skill of a remote A2A agent the operator configured (``CASETRAIL_A2A_AGENTS``):
    a WorkerTool served by that agent's capability worker, which sends a message and
    follows the task to its end. With ``input`` (a pydantic model) the model's arguments
    are the message's data part; without it, the model writes the message's text. The
    model sees it as ``<agent>_<skill>`` unless ``name`` says otherwise; the result is the
    task's artifacts."""
    if not re.match(engine_tools.MCP_SERVER_NAME, agent):
        raise DeclarationError(f"A2A agent name {agent!r} must match "
                               f"{engine_tools.MCP_SERVER_NAME}")
    tool_name = name or engine_tools.mcp_tool_name(agent, skill or "ask")
    if not TOOL_NAME.match(tool_name):
        raise DeclarationError(f"tool name {tool_name!r} must match {TOOL_NAME.pattern}")
    said = description or (f"Ask the remote agent {agent}"
                           + (f" for its skill {skill}" if skill else "")
                           + "; the answer is its task's artifacts.")
    return engine_tools.WorkerTool(
        tool_name, said, engine_tools.a2a_capability(agent), input or A2aText,
        a2a=engine_tools.A2aBinding(agent, skill, text=input is None))


def capability(name: str) -> Callable[[Callable[[ArgsT], Awaitable[Any]]], Capability[ArgsT]]:
    """Declare an async function as the handler of a capability: its one argument is the
    pydantic model of the requests it serves; it returns their JSON result."""
    if not NAME.match(name):
        raise DeclarationError(f"capability name {name!r} must match {NAME.pattern}")

    def declare(handler: Callable[[ArgsT], Awaitable[Any]]) -> Capability[ArgsT]:
        if not inspect.iscoroutinefunction(handler):
            raise DeclarationError(f"capability {name!r}: {handler.__qualname__} must be "
                                   "async")
        args_model: type[ArgsT] = _args_model(handler, "capability")  # type: ignore[assignment]
        return Capability(name, args_model, handler)

    return declare


@dataclass(frozen=True)
class Agent:
    """An agent: what it is for, how it is instructed, what its cases' input is, which
    tools it may use, and the model and limits a case gets unless it asks for others.
    ``script`` (a scripted brain) is needed only when ``model`` is the scripted provider;
    ``capabilities`` are handlers this package serves for its WorkerTools."""

    name: str
    version: str
    description: str
    instructions: str
    input: type[BaseModel]
    answer: type[BaseModel]
    """The answer's schema: the model gives it through the final-answer tool, and a case
    completes only with an answer that validates against it."""
    tools: Sequence[ToolSource] = ()
    checks: Sequence[Check] = ()
    """Named, versioned checks over the input, the tool calls and the answer, run before
    the outcome (``Check(name, version, fn, blocking=True)``)."""
    keys: Sequence[str] = ()
    """Input fields (JSON names) that identify a case to people (``GET /cases?key=``)."""
    review: Review | None = None
    """Which answers a person decides before the case ends
    (``Review(decisions={"refer"}, failed_checks=True)``)."""
    asks_people: bool = False
    """Offer the model ``ask_a_person``: a question waits for a person's answer (a
    reviewer's, through REST, the CLI or the viewer), which is the call's result."""
    model: ModelRef | None = None
    limits: Limits = field(default_factory=lambda: Limits(max_cycles=10, deadline_seconds=120))
    script: ScriptFn | None = None
    capabilities: Sequence[Capability[Any]] = ()
    context_budget_tokens: int = 32_000

    def profile(self) -> AgentProfile:
        """The agent as the engine runs it; ``DeclarationError`` when it cannot run."""
        if not NAME.match(self.name):
            raise DeclarationError(f"agent name {self.name!r} must match {NAME.pattern}")
        for part, declared in (("input", self.input), ("answer", self.answer)):
            if not (isinstance(declared, type) and issubclass(declared, BaseModel)):
                raise DeclarationError(f"agent {self.name!r}: {part} must be a pydantic model")
        fields = {f.alias or name for name, f in self.input.model_fields.items()}
        if unknown := [k for k in self.keys if k not in fields]:
            raise DeclarationError(f"agent {self.name!r}: keys {unknown} are not fields of "
                                   "its input")
        answered = {f.alias or name for name, f in self.answer.model_fields.items()}
        if self.review is not None and self.review.field not in answered:
            raise DeclarationError(f"agent {self.name!r}: review.field {self.review.field!r} "
                                   "is not a field of its answer")
        names = [tool.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise DeclarationError(f"agent {self.name!r} names a tool twice: {names}")
        if reserved := sorted(set(names) & ENGINE_TOOLS):
            raise DeclarationError(f"agent {self.name!r}: the engine offers {reserved} itself "
                                   "(the answer, a question to a person); give the tool "
                                   "another name")
        model = self.model or ModelRef(provider="scripted", name=f"{self.name}-scripted")
        if model.provider == "scripted" and self.script is None:
            raise DeclarationError(f"agent {self.name!r}: its model is the scripted provider "
                                   "but it has no script (give one, or name a real model)")
        return AgentProfile(
            name=self.name, description=self.description, system_prompt=self.instructions,
            tools=tuple(self.tools), input_model=self.input, default_model=model,
            default_limits=self.limits, script=self.script,
            capabilities=tuple(self.capabilities), version=self.version,
            context_budget_tokens=self.context_budget_tokens, answer_model=self.answer,
            checks=tuple(self.checks), keys=tuple(self.keys), review=self.review,
            asks_people=self.asks_people)
