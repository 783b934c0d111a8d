"""Chat-model providers behind the one ``ChatModel`` interface, chosen per case."""

from __future__ import annotations

from collections.abc import Sequence

from service.agents.profile import AgentProfile
from service.engine.chat import AssistantTurn, ChatMessage, ChatModel, ToolSpec
from service.engine.scripted import ScriptedModel
from service.errors import ModelRejected
from service.events import ModelRef


class UnavailableProvider:
    """A provider this deployment cannot serve; every request is refused, so the case
    ends ``CASE_FAILED`` with ``model_error`` and the reason, never silently."""

    def __init__(self, ref: ModelRef, reason: str) -> None:
        self._ref = ref
        self._reason = reason

    @property
    def name(self) -> str:
        return self._ref.name

    async def request(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AssistantTurn:
        raise ModelRejected(self._reason)


def build_model(ref: ModelRef, agent: AgentProfile) -> ChatModel:
    """The chat model a case asked for."""
    match ref.provider:
        case "scripted":
            return ScriptedModel(agent.script, name=ref.name, latency=(ref.latency_ms or 0) / 1000)
        case "openai" | "anthropic":
            return UnavailableProvider(
                ref, f"provider {ref.provider!r} is not supported by this casetrail build yet"
            )
