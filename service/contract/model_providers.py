"""The model providers casetrail speaks, one line each (docs/design.md, "Where a change
goes"): a built-in provider is a module under ``service/providers/`` with its
``ChatModel`` and a ``ProviderSpec`` line here; a provider of your own is a package with
its ``ChatModel`` and a ``ProviderSpec`` named by an entry point in the group
``casetrail.model_providers`` (docs/agents.md, "A model provider of your own").
Everything else — the names a ``ModelRef`` and a model endpoint accept, the OpenAPI
document's choices, the default endpoint, the headers that carry its key, the variables
its key is read from — comes from this table.

It imports only casetrail's errors (the contract's ``ModelRef`` reads it); the one thing
it reads is the installed packages' entry points, once, when it is first imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Annotated, Any

from pydantic import AfterValidator, WithJsonSchema

from casetrail.errors import ProviderPluginError

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


PROVIDER_GROUP = "casetrail.model_providers"
"""The entry-point group of outside packages' model providers."""

BUILT_IN: dict[str, ProviderSpec] = {spec.name: spec for spec in (
    ProviderSpec("openai", "OpenAI", "https://api.openai.com/v1",
                 "casetrail.providers.openai_compat:OpenAIChatModel"),
    ProviderSpec("anthropic", "Anthropic", "https://api.anthropic.com",
                 "casetrail.providers.anthropic_messages:AnthropicChatModel",
                 key_header="x-api-key", key_prefix="",
                 headers=(("anthropic-version", "2023-06-01"),)),
)}


def _installed() -> dict[str, ProviderSpec]:
    """The providers installed packages name, each checked: a ``ProviderSpec``, a name
    of its own (never a built-in's, ``scripted`` or another package's)."""
    found: dict[str, ProviderSpec] = {}
    for point in sorted(entry_points(group=PROVIDER_GROUP), key=lambda p: p.name):
        origin = (f"entry point {PROVIDER_GROUP}:{point.name} = {point.value}"
                  + (f" of package {point.dist.name}" if point.dist is not None else ""))
        try:
            spec = point.load()
        except Exception as exc:  # any failure of the package's own import is reported
            raise ProviderPluginError(f"{origin}: cannot be loaded: {exc}") from exc
        if not isinstance(spec, ProviderSpec):
            raise ProviderPluginError(f"{origin}: names a {type(spec).__name__}, not a "
                                      "casetrail ProviderSpec")
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", spec.name):
            raise ProviderPluginError(f"{origin}: the name {spec.name!r} is not 1-40 "
                                      "lower-case letters, digits or underscores")
        if spec.name == SCRIPTED or spec.name in BUILT_IN or spec.name in found:
            raise ProviderPluginError(f"{origin}: the provider name {spec.name!r} is "
                                      "taken")
        found[spec.name] = spec
    return found


PROVIDERS: dict[str, ProviderSpec] = {**BUILT_IN, **_installed()}
"""Every provider this installation speaks: the built-in ones, then installed packages'."""


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
