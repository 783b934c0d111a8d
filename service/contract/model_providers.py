"""The model providers casetrail speaks, one line each (docs/design.md, "Where a change
goes"): a new provider is a module under ``service/providers/`` with its ``ChatModel``
and a ``ProviderSpec`` line here. Everything else — the names a ``ModelRef`` and a model
endpoint accept, the OpenAPI document's choices, the default endpoint, the headers that
carry its key, the variables its key is read from — comes from this table.

No I/O and no imports of casetrail's own: the contract (``ModelRef``) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, WithJsonSchema

SCRIPTED = "scripted"
"""The scripted provider: a brain in process, for tests, demos and benchmarks."""


@dataclass(frozen=True)
class ProviderSpec:
    """A remote chat-model provider."""

    name: str
    """Its name in ``ModelRef.provider`` and ``CASETRAIL_MODEL_ENDPOINTS``."""
    title: str
    """Its name for people, in messages."""
    default_base_url: str
    chat_model: str
    """``module:Class`` of its ``ChatModel`` (loaded by the worker when a case needs it),
    built as ``Class(model_name, client)``."""
    key_header: str = "Authorization"
    key_prefix: str = "Bearer "
    """The key is sent as ``<key_header>: <key_prefix><key>``."""
    headers: tuple[tuple[str, str], ...] = ()
    """Headers every request to it carries (an API version)."""

    def request_headers(self, api_key: str) -> dict[str, str]:
        return {**dict(self.headers), self.key_header: f"{self.key_prefix}{api_key}"}

    @property
    def key_variables(self) -> tuple[str, str]:
        """Where its key is read from: ``CASETRAIL_<NAME>_API_KEY``, else ``<NAME>_API_KEY``."""
        upper = self.name.upper()
        return f"CASETRAIL_{upper}_API_KEY", f"{upper}_API_KEY"


PROVIDERS: dict[str, ProviderSpec] = {spec.name: spec for spec in (
    ProviderSpec("openai", "OpenAI", "https://api.openai.com/v1",
                 "casetrail.providers.openai_compat:OpenAIChatModel"),
    ProviderSpec("anthropic", "Anthropic", "https://api.anthropic.com",
                 "casetrail.providers.anthropic_messages:AnthropicChatModel",
                 key_header="x-api-key", key_prefix="",
                 headers=(("anthropic-version", "2023-06-01"),)),
)}


def _remote(name: str) -> str:
    if name not in PROVIDERS:
        raise ValueError(f"Input should be one of {', '.join(map(repr, PROVIDERS))}")
    return name


def _any(name: str) -> str:
    if name != SCRIPTED and name not in PROVIDERS:
        raise ValueError(f"Input should be one of {', '.join(map(repr, [SCRIPTED, *PROVIDERS]))}")
    return name


def _enum(names: list[str]) -> dict[str, Any]:
    return {"type": "string", "enum": names}


RemoteProvider = Annotated[str, AfterValidator(_remote), WithJsonSchema(_enum(list(PROVIDERS)))]
"""A remote provider's name (a model endpoint's)."""
ProviderName = Annotated[str, AfterValidator(_any),
                         WithJsonSchema(_enum([SCRIPTED, *PROVIDERS]))]
"""Any provider's name (a ``ModelRef``'s)."""
