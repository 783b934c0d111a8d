"""casetrail's public authoring API: declare your own agents and capabilities in your
own package; casetrail discovers and runs them (docs/agents.md). What is exported here
is the stable surface; every module not named here may move between releases.

- ``Agent``, ``LocalTool``, ``WorkerTool``, ``McpTool`` (a tool of an MCP server the
  operator configured), ``A2aTool`` (a skill of a remote A2A agent the operator
  configured), ``capability``, ``Sensitive``, ``Limits``,
  ``ModelRef``, ``Check`` (with ``CheckContext``): the declaration; an agent's answer is a
  pydantic model the model gives by calling ``FINAL_ANSWER``; ``Review`` says which
  answers a person decides before the case ends.
- ``AssistantTurn``, ``ChatMessage``, ``call``, ``case_input``, ``observed``: for a
  scripted brain (a function from the conversation so far to the next turn), which an
  agent needs only when its model is the scripted provider.
- ``ChatModel``: the whole provider surface (``request(messages, tools) ->
  AssistantTurn``), for a model of your own that ``casetrail.testing.run_case`` takes
  (it also takes a ``ModelRef`` to a configured endpoint).
- ``ProviderSpec``: a model provider of your own, named by an entry point in the group
  ``casetrail.model_providers`` (its ``ChatModel`` built as ``Class(model, client)``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from casetrail.contract.version import CASETRAIL_VERSION

if TYPE_CHECKING:
    from casetrail.agents.authoring import (
        A2aTool,
        Agent,
        DeclarationError,
        LocalTool,
        McpTool,
        WorkerTool,
        capability,
    )
    from casetrail.agents.profile import case_input, observed
    from casetrail.contract.events import Limits, ModelRef
    from casetrail.contract.model_providers import ProviderSpec
    from casetrail.engine.answers import FINAL_ANSWER, Check, CheckContext, Review
    from casetrail.engine.chat import AssistantTurn, ChatMessage, ChatModel, ToolCallRequest
    from casetrail.engine.scripted import call
    from casetrail.privacy.sensitive import Sensitive

# Where each public name lives. Loaded on first use, so that importing one of
# casetrail's own modules (a component, the CLI) does not load the authoring API.
_PUBLIC = {
    "A2aTool": "casetrail.agents.authoring",
    "Agent": "casetrail.agents.authoring", "DeclarationError": "casetrail.agents.authoring",
    "LocalTool": "casetrail.agents.authoring", "McpTool": "casetrail.agents.authoring",
    "WorkerTool": "casetrail.agents.authoring", "capability": "casetrail.agents.authoring",
    "case_input": "casetrail.agents.profile", "observed": "casetrail.agents.profile",
    "Limits": "casetrail.contract.events", "ModelRef": "casetrail.contract.events",
    "ProviderSpec": "casetrail.contract.model_providers",
    "FINAL_ANSWER": "casetrail.engine.answers", "Check": "casetrail.engine.answers",
    "CheckContext": "casetrail.engine.answers", "Review": "casetrail.engine.answers",
    "AssistantTurn": "casetrail.engine.chat", "ChatMessage": "casetrail.engine.chat",
    "ChatModel": "casetrail.engine.chat",
    "ToolCallRequest": "casetrail.engine.chat", "call": "casetrail.engine.scripted",
    "Sensitive": "casetrail.privacy.sensitive",
}

__all__ = ["CASETRAIL_VERSION", "FINAL_ANSWER", "A2aTool", "Agent", "AssistantTurn", "ChatMessage",
           "ChatModel", "Check", "CheckContext", "DeclarationError", "Limits", "LocalTool",
           "McpTool", "ModelRef", "ProviderSpec",
           "Review", "Sensitive", "ToolCallRequest", "WorkerTool", "call", "capability",
           "case_input", "observed"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'casetrail' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
