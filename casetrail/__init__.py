"""casetrail's public authoring API: declare your own agents and capabilities in your
own package; casetrail discovers and runs them (docs/agents.md). What is exported here
is the stable surface; everything under ``service`` may move between releases.

- ``Agent``, ``LocalTool``, ``WorkerTool``, ``McpTool`` (a tool of an MCP server the
  operator configured), ``capability``, ``Sensitive``, ``Limits``,
  ``ModelRef``, ``Check`` (with ``CheckContext``): the declaration; an agent's answer is a
  pydantic model the model gives by calling ``FINAL_ANSWER``; ``Review`` says which
  answers a person decides before the case ends.
- ``AssistantTurn``, ``ChatMessage``, ``call``, ``case_input``, ``observed``: for a
  scripted brain (a function from the conversation so far to the next turn), which an
  agent needs only when its model is the scripted provider.
"""

from service.agents.profile import case_input, observed
from service.authoring import (
    Agent,
    DeclarationError,
    LocalTool,
    McpTool,
    WorkerTool,
    capability,
)
from service.engine.answers import FINAL_ANSWER, Check, CheckContext, Review
from service.engine.chat import AssistantTurn, ChatMessage, ToolCallRequest
from service.engine.scripted import call
from service.events import Limits, ModelRef
from service.sensitive import Sensitive

__all__ = ["FINAL_ANSWER", "Agent", "AssistantTurn", "ChatMessage", "Check", "CheckContext",
           "DeclarationError", "Limits", "LocalTool", "McpTool", "ModelRef", "Review", "Sensitive",
           "ToolCallRequest", "WorkerTool", "call", "capability", "case_input", "observed"]
