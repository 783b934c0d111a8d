"""Remote A2A agents as WorkerTools (docs/a2a.md, "Remote agents as tools").

An operator configures remote agents (``CASETRAIL_A2A_AGENTS``); each is served by the
capability ``a2a-<agent>``, whose capability worker holds the official SDK's client
(``service/a2a/remote.py``). An agent names the skill it may ask for
(``A2aTool(agent, skill, input=...)``); a call rides the bus like any WorkerTool — its
timeout, retries (each sending the same ``messageId``: a remote agent that keeps message
ids, as casetrail's own do, starts one task), distribution and sealed sensitive values
— and its record names the agent, the pinned card's digest and the remote task
(``ToolCallRecord.a2a``), with the task's artifacts as the result.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class A2aRequest(BaseModel):
    """The arguments of a request to the capability ``a2a-<agent>``."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    arguments: dict[str, Any] = Field(description="The tool's arguments: the message's "
                                      "data part (or, with ``text``, its ``text`` field "
                                      "as the message's text).")
    message_id: str = Field(min_length=1, max_length=200, description="The call's "
                            "idempotency key: every attempt sends it as the messageId.")
    skill: str | None = Field(default=None, max_length=200)
    text: bool = False


__all__ = ["A2aRequest"]
