"""Chat-model providers behind the one ``ChatModel`` interface, chosen per case.

API keys come from the environment only. A case either uses a provider's own API,
with the provider key (``CASETRAIL_OPENAI_API_KEY`` or ``OPENAI_API_KEY``,
likewise for Anthropic), or names an endpoint the operator configured
(``CASETRAIL_MODEL_ENDPOINTS``: name, provider, baseUrl, apiKeyEnv), which gets
its own key and no other. So a case cannot make the server send a key anywhere it
was not configured for; keys never appear in events, logs or API responses.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Sequence

from pydantic import SecretStr

from casetrail.agents.profile import AgentProfile
from casetrail.config import Settings
from casetrail.contract.events import ModelRef
from casetrail.contract.model_providers import PROVIDERS, ProviderSpec
from casetrail.engine.chat import AssistantTurn, ChatMessage, ChatModel, ToolSpec
from casetrail.engine.scripted import ScriptedModel
from casetrail.errors import ModelRejected
from casetrail.providers.clients import ModelClients, PoolSettings, ProviderClient


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
    if ref.provider == "scripted":
        for field, value in (("endpoint", ref.endpoint), ("baseUrl", ref.base_url)):
            if value is not None:
                return field, f"{field} applies to the {' and '.join(PROVIDERS)} providers only"
        return None
    if ref.endpoint is not None:
        entry = settings.endpoint(ref.endpoint)
        if entry is None:
            return "endpoint", (f"no model endpoint {ref.endpoint!r} is configured "
                                "(CASETRAIL_MODEL_ENDPOINTS)")
        if entry.provider != ref.provider:
            return "endpoint", f"endpoint {entry.name!r} serves the {entry.provider} provider"
        if ref.base_url is not None and ref.base_url.rstrip("/") != entry.base_url:
            return "baseUrl", f"baseUrl is not endpoint {entry.name!r}'s"
        return None
    if ref.base_url is not None and \
            settings.endpoint(provider=ref.provider, base_url=ref.base_url) is None:
        return "baseUrl", (f"baseUrl {ref.base_url!r} is not a configured {ref.provider} "
                           "endpoint's (CASETRAIL_MODEL_ENDPOINTS)")
    return None


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


class ModelFactory:
    """Builds the chat model a case asked for."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.clients = ModelClients(PoolSettings(
            size=settings.model_pool_size, connect_timeout=settings.model_connect_timeout_seconds,
            timeout=settings.model_timeout_seconds, proxy=_secret(settings.model_proxy),
            ca_file=settings.model_ca_file))

    async def aclose(self) -> None:
        """Close the shared clients (the worker's shutdown)."""
        await self.clients.aclose()

    def __call__(self, ref: ModelRef, agent: AgentProfile) -> ChatModel:
        problem = model_problem(ref, self._settings)
        if problem:
            return UnavailableProvider(ref, problem[1])
        if ref.provider == "scripted":
            if agent.script is None:
                return UnavailableProvider(ref, f"agent {agent.name!r} has no scripted brain")
            return ScriptedModel(agent.script, name=ref.name,
                                 latency=(ref.latency_ms or 0) / 1000)
        spec = PROVIDERS[ref.provider]
        entry = self._settings.endpoint(ref.endpoint) if ref.endpoint is not None else \
            self._settings.endpoint(provider=ref.provider, base_url=ref.base_url)
        if entry is not None:
            # The endpoint's own key, or none: never the provider's key.
            key = os.environ.get(entry.api_key_env) if entry.api_key_env else "not-needed"
            if not key:
                return UnavailableProvider(ref, f"endpoint {entry.name!r}: its key variable "
                                           f"{entry.api_key_env} is not set")
            base_url: str | None = entry.base_url
        else:
            base_url, key = None, self._provider_key(spec)
            if not key:
                ours, theirs = spec.key_variables
                return UnavailableProvider(ref, f"no {spec.title} API key is configured "
                                           f"({ours} or {theirs})")
        return _chat_model(spec)(ref.name, self.clients.client(ref.provider, base_url, key))

    def _provider_key(self, spec: ProviderSpec) -> str | None:
        """The provider's own key: its setting (``CASETRAIL_<NAME>_API_KEY``, also read
        from the environment for a provider with no setting of its own), else
        ``<NAME>_API_KEY``."""
        ours, theirs = spec.key_variables
        configured = getattr(self._settings, f"{spec.name}_api_key", None)
        return _secret(configured) or os.environ.get(ours) or os.environ.get(theirs)


@functools.cache
def _chat_model(spec: ProviderSpec) -> Callable[[str, ProviderClient], ChatModel]:
    module, _, attr = spec.chat_model.partition(":")
    made: Callable[[str, ProviderClient], ChatModel] = getattr(
        importlib.import_module(module), attr)
    return made
