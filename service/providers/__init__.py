"""Chat-model providers behind the one ``ChatModel`` interface, chosen per case.

API keys come from the environment only (``CASETRAIL_OPENAI_API_KEY`` or
``OPENAI_API_KEY``, likewise for Anthropic). They never appear in events, logs
or API responses, and a case may point a provider only at a base URL the
operator allowed (``CASETRAIL_MODEL_BASE_URLS``), so a case cannot make the
server send its key elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from pydantic import SecretStr

from service.agents.profile import AgentProfile
from service.config import Settings
from service.engine.chat import AssistantTurn, ChatMessage, ChatModel, ToolSpec
from service.engine.scripted import ScriptedModel
from service.errors import ModelRejected
from service.events import ModelRef


class UnavailableProvider:
    """A model this deployment cannot serve; every request is refused, so the case
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


def model_problem(ref: ModelRef, settings: Settings) -> tuple[str, str] | None:
    """The field of ``ref`` that may not be used and why, or ``None`` when all may."""
    if ref.latency_ms is not None and ref.provider != "scripted":
        return "latencyMs", "latencyMs applies to the scripted provider only"
    if ref.base_url is None:
        return None
    if ref.provider == "scripted":
        return "baseUrl", "baseUrl applies to the openai and anthropic providers only"
    if ref.base_url.rstrip("/") not in settings.allowed_base_urls():
        return "baseUrl", (f"baseUrl {ref.base_url!r} is not one the operator allowed "
                           "(CASETRAIL_MODEL_BASE_URLS)")
    return None


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


class ModelFactory:
    """Builds the chat model a case asked for."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def __call__(self, ref: ModelRef, agent: AgentProfile) -> ChatModel:
        problem = model_problem(ref, self._settings)
        if problem:
            return UnavailableProvider(ref, problem[1])
        timeout = self._settings.model_timeout_seconds
        match ref.provider:
            case "scripted":
                return ScriptedModel(agent.script, name=ref.name,
                                     latency=(ref.latency_ms or 0) / 1000)
            case "openai":
                from service.providers.openai_compat import OpenAIChatModel

                key = _secret(self._settings.openai_api_key) or os.environ.get("OPENAI_API_KEY")
                if not key and ref.base_url is None:
                    return UnavailableProvider(ref, "no OpenAI API key is configured "
                                               "(CASETRAIL_OPENAI_API_KEY or OPENAI_API_KEY)")
                return OpenAIChatModel(ref.name, api_key=key or "not-needed",
                                       base_url=ref.base_url, timeout=timeout)
            case "anthropic":
                from service.providers.anthropic_messages import AnthropicChatModel

                key = _secret(self._settings.anthropic_api_key) \
                    or os.environ.get("ANTHROPIC_API_KEY")
                if not key and ref.base_url is None:
                    return UnavailableProvider(ref, "no Anthropic API key is configured "
                                               "(CASETRAIL_ANTHROPIC_API_KEY or "
                                               "ANTHROPIC_API_KEY)")
                return AnthropicChatModel(ref.name, api_key=key or "not-needed",
                                          base_url=ref.base_url, timeout=timeout)
