"""The registry of agents and capabilities: the built-in agents, those of installed
packages (entry points ``casetrail.agents`` and ``casetrail.capabilities``) and those a
deployment names in ``CASETRAIL_AGENTS`` (``module:attr,...``), found once per process
and the same in every component (the API validates input against them, the worker
runs them, the capability worker serves their capabilities, setup declares their
queues). A plugin that does not load, or collides with another, is one
``PluginError`` naming where it came from: the component refuses to start.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from casetrail.agents.profile import AgentProfile
from casetrail.engine.tools import Capability
from casetrail.errors import PermanentError

if TYPE_CHECKING:
    from casetrail.config import A2aAgent, McpServer

AGENT_GROUP = "casetrail.agents"
CAPABILITY_GROUP = "casetrail.capabilities"
BUILT_IN = "casetrail (built-in)"

V = TypeVar("V")


class PluginError(PermanentError):
    """An agent or capability that could not be loaded, named with its origin."""


@dataclass
class Registry:
    """What was found, and where from (``origins``: ``agent:NAME`` / ``capability:NAME``
    to the package, entry point or setting that gave it)."""

    agents: dict[str, AgentProfile] = field(default_factory=dict)
    capabilities: dict[str, Capability[Any]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)

    def add(self, found: object, origin: str) -> None:
        """An agent (a profile or an ``Agent`` declaration), a capability, or a sequence
        of them."""
        if isinstance(found, Sequence) and not isinstance(found, str | bytes):
            for item in found:
                self.add(item, origin)
            return
        if isinstance(found, Capability):
            self._put(self.capabilities, "capability", found.name, found, origin)
            return
        declared = getattr(found, "profile", None)  # an Agent declaration
        profile = declared() if callable(declared) else found
        if not isinstance(profile, AgentProfile):
            raise PluginError(f"{origin}: {type(found).__name__} is neither an agent nor a "
                              "capability")
        if profile.answer_model is None:  # no case may complete without a typed answer
            raise PluginError(f"{origin}: agent {profile.name!r} declares no answer schema")
        self._put(self.agents, "agent", profile.name, profile, origin)
        for served in profile.capabilities:
            self._put(self.capabilities, "capability", served.name, served, origin)

    def _put(self, into: dict[str, V], kind: str, name: str, value: V, origin: str) -> None:
        key = f"{kind}:{name}"
        if name in into and into[name] is not value:
            raise PluginError(f"{kind} {name!r} is declared twice: by {self.origins[key]} and "
                              f"by {origin}")
        into[name] = value
        self.origins.setdefault(key, origin)


def _entry_point_origin(point: EntryPoint) -> str:
    dist = point.dist
    package = f"package {dist.name} {dist.version}" if dist is not None else "a package"
    return f"{package} (entry point {point.group}:{point.name} = {point.value})"


def _load(point: EntryPoint) -> object:
    try:
        return point.load()
    except Exception as exc:
        raise PluginError(f"{_entry_point_origin(point)} failed to load: "
                          f"{type(exc).__name__}: {exc}") from exc


def _named(spec: str) -> object:
    module, _, attr = spec.partition(":")
    try:
        found: object = importlib.import_module(module.strip())
        for part in attr.strip().split("."):
            found = getattr(found, part)
    except Exception as exc:
        raise PluginError(f"CASETRAIL_AGENTS entry {spec!r} failed to load: "
                          f"{type(exc).__name__}: {exc}") from exc
    return found


def discover(named: Sequence[str] = (), mcp_servers: Sequence[McpServer] = (),
             a2a_agents: Sequence[A2aAgent] = ()) -> Registry:
    """Every agent and capability: built in, installed, or ``named`` (``module:attr``),
    and the capabilities of the configured MCP servers and remote A2A agents."""
    from casetrail.agents.aml_screening import AML_SCREENING
    from casetrail.agents.loan_officer import LOAN_OFFICER
    from casetrail.agents.throughput_probe import THROUGHPUT_PROBE

    registry = Registry()
    registry.add([LOAN_OFFICER, AML_SCREENING, THROUGHPUT_PROBE], BUILT_IN)
    for group in (AGENT_GROUP, CAPABILITY_GROUP):
        for point in sorted(entry_points(group=group), key=lambda p: p.name):
            origin = _entry_point_origin(point)
            try:
                registry.add(_load(point), origin)
            except PluginError:
                raise
            except PermanentError as exc:  # a declaration that cannot run
                raise PluginError(f"{origin}: {exc}") from exc
    for spec in named:
        try:
            registry.add(_named(spec), f"CASETRAIL_AGENTS {spec}")
        except PluginError:
            raise
        except PermanentError as exc:
            raise PluginError(f"CASETRAIL_AGENTS {spec}: {exc}") from exc
    if mcp_servers:
        from casetrail.mcp.capabilities import mcp_capabilities

        for server, served in zip(mcp_servers, mcp_capabilities(mcp_servers), strict=True):
            registry.add(served, f"CASETRAIL_MCP_SERVERS {server.name}")
    if a2a_agents:
        from casetrail.a2a.capabilities import a2a_capabilities

        for remote, calls in zip(a2a_agents, a2a_capabilities(a2a_agents), strict=True):
            registry.add(calls, f"CASETRAIL_A2A_AGENTS {remote.name}")
    return registry


@cache
def registry() -> Registry:
    """This process's registry, found on first use (``CASETRAIL_AGENTS`` from its
    settings)."""
    from casetrail.config import get_settings

    settings = get_settings()
    return discover(settings.agents, settings.mcp_servers, settings.a2a_agents)


@dataclass(frozen=True)
class _Found(Mapping[str, V], Generic[V]):
    """A view of the registry that finds it on first use."""

    part: str

    def _items(self) -> dict[str, V]:
        found: dict[str, V] = getattr(registry(), self.part)
        return found

    def __getitem__(self, name: str) -> V:
        return self._items()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())


AGENTS: Mapping[str, AgentProfile] = _Found("agents")
CAPABILITIES: Mapping[str, Capability[Any]] = _Found("capabilities")

__all__ = ["AGENTS", "CAPABILITIES", "AgentProfile", "PluginError", "Registry",
           "challenger_of", "discover", "registry"]


def challenger_of(request: Mapping[str, Any], agent: str) -> AgentProfile:
    """The installed agent a backtest runs as the challenger: ``challenger`` (``NAME`` or
    ``NAME@VERSION``, checked against what is installed), else the agent itself."""
    name, _, version = (request.get("challenger") or agent).partition("@")
    profile = AGENTS.get(name)
    if profile is None:
        raise LookupError(f"no agent {name!r} is installed here")
    if version and profile.version != version:
        raise LookupError(f"{name} is installed at version {profile.version}, not {version}")
    return profile
