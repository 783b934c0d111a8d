"""Whether each agent can run as this deployment is configured (docs/agents.md, "When an
agent is not configured"): every MCP server and remote A2A agent it names is
configured, every capability its WorkerTools need is served by an installed package, an
MCP server or a declared extra capability, and its model (a configured endpoint, a
scripted brain) may be used.

A misconfigured agent is loud everywhere: ``casetrail check`` and ``casetrail agents``
exit 1 naming each reason, the worker logs them at start, and ``POST /cases`` for it is
a problem naming them — never a case that quietly lacks its tools. A server that is
configured but down is not a misconfiguration: its last catalog is offered, marked
stale on the record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from casetrail.agents.profile import AgentProfile
from casetrail.config import Settings
from casetrail.engine.tools import WorkerTool
from casetrail.providers import model_problem


def agent_problems(agent: AgentProfile, settings: Settings, served: Iterable[str]
                   ) -> list[str]:
    """Why ``agent`` cannot run here (none: it can); ``served`` the capabilities this
    deployment serves."""
    servers = {server.name for server in settings.mcp_servers}
    remotes = {remote.name for remote in settings.a2a_agents}
    capabilities = set(served) | set(settings.extra_capabilities)
    problems: list[str] = []
    for tool in agent.tools:
        if not isinstance(tool, WorkerTool):
            continue
        if tool.a2a is not None:
            if tool.a2a.agent not in remotes:
                problems.append(
                    f"tool {tool.name!r} names the A2A agent {tool.a2a.agent!r}, which "
                    f"CASETRAIL_A2A_AGENTS does not configure (it configures: "
                    f"{', '.join(sorted(remotes)) or 'none'})")
        elif tool.mcp is not None and tool.mcp.server not in servers:
            problems.append(
                f"tool {tool.name!r} names the MCP server {tool.mcp.server!r}, which "
                f"CASETRAIL_MCP_SERVERS does not configure (it configures: "
                f"{', '.join(sorted(servers)) or 'none'})")
        elif tool.mcp is None and tool.capability not in capabilities:
            problems.append(
                f"tool {tool.name!r} needs the capability {tool.capability!r}, which no "
                "installed package serves and CASETRAIL_EXTRA_CAPABILITIES does not name")
    model = agent.default_model
    if problem := model_problem(model, settings):
        problems.append(f"its model {model.provider}/{model.name}: {problem[1]}")
    elif model.provider == "scripted" and agent.script is None:
        problems.append("its model is the scripted provider, and it has no scripted brain")
    return problems


def misconfigured(agents: Mapping[str, AgentProfile], settings: Settings,
                  served: Iterable[str]) -> dict[str, list[str]]:
    """Each agent that cannot run here, with its reasons."""
    capabilities = set(served)
    found = {name: agent_problems(agent, settings, capabilities)
             for name, agent in agents.items()}
    return {name: problems for name, problems in found.items() if problems}


def described(name: str, problems: Iterable[str]) -> str:
    """One line: the agent and why it cannot run."""
    return f"agent {name!r} is not configured to run here: {'; '.join(problems)}"
