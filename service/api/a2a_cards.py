"""Agent Cards (A2A 1.0): what another agent reads to find a casetrail agent and call it
(docs/a2a.md).

The well-known URI holds one card, so each agent has its own base, ``/a2a/{agent}/``,
with its card at ``/a2a/{agent}/.well-known/agent-card.json``; the host's
``/.well-known/agent-card.json`` is the card of the default agent
(``CASETRAIL_A2A_DEFAULT_AGENT``, else the first agent offered). A card is public and
says only what any caller may know: the agent's name, description, version and
``agentDigest``, one skill with its input and answer JSON Schemas, the JSON-RPC and
HTTP+JSON interfaces, and the security schemes REST takes (a bearer API key, an OIDC token).
"""

from __future__ import annotations

from typing import Any

import orjson
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    HTTPAuthSecurityScheme,
    OpenIdConnectSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from google.protobuf.json_format import MessageToDict

from casetrail.agents.profile import AgentProfile
from casetrail.config import Settings

PROTOCOL_VERSION = "1.0"
INPUT_MODES = ["application/json"]
OUTPUT_MODES = ["application/json", "text/plain"]


def agent_base(base_url: str, agent: str) -> str:
    """Where an agent's A2A interface is served: ``<API>/a2a/<agent>/``."""
    return f"{base_url.rstrip('/')}/a2a/{agent}/"


def _schemes(settings: Settings) -> tuple[dict[str, SecurityScheme], list[SecurityRequirement]]:
    schemes = {"apiKey": SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
        scheme="Bearer", description="A casetrail API key (`casetrail keys create`), as "
        "REST takes it: the same scopes, tenant, quotas and rate limits."))}
    if settings.oidc_issuer:
        schemes["oidc"] = SecurityScheme(open_id_connect_security_scheme=(
            OpenIdConnectSecurityScheme(open_id_connect_url=(
                f"{settings.oidc_issuer.rstrip('/')}/.well-known/openid-configuration"))))
    return schemes, [SecurityRequirement(schemes={name: StringList()}) for name in schemes]


def agent_card(agent: AgentProfile, base_url: str, settings: Settings) -> AgentCard:
    """The public card of ``agent`` served from ``base_url`` (the API's)."""
    schemes, requirements = _schemes(settings)
    skill = AgentSkill(
        id=agent.name, name=agent.name, description=_skill_text(agent),
        tags=["casetrail", *agent.keys], input_modes=INPUT_MODES, output_modes=OUTPUT_MODES,
        examples=[orjson.dumps(example).decode() for example in _examples(agent)])
    return AgentCard(
        name=agent.name, description=agent.description,
        version=f"{agent.version}+{agent.digest}",
        supported_interfaces=[
            AgentInterface(url=agent_base(base_url, agent.name), protocol_binding="JSONRPC",
                           protocol_version=PROTOCOL_VERSION),
            AgentInterface(url=agent_base(base_url, agent.name).rstrip("/"),
                           protocol_binding="HTTP+JSON", protocol_version=PROTOCOL_VERSION)],
        provider=AgentProvider(organization="casetrail", url=base_url.rstrip("/")),
        documentation_url=f"{base_url.rstrip('/')}/docs",
        capabilities=AgentCapabilities(streaming=True, push_notifications=False,
                                       extended_agent_card=False),
        security_schemes=schemes, security_requirements=requirements,
        default_input_modes=INPUT_MODES, default_output_modes=OUTPUT_MODES, skills=[skill])


def card_json(card: AgentCard) -> dict[str, Any]:
    """The card as A2A's JSON (protobuf's JSON mapping, camelCase)."""
    shown: dict[str, Any] = MessageToDict(card, preserving_proto_field_name=False)
    return shown


def _skill_text(agent: AgentProfile) -> str:
    """The skill's description: what to send (a data part holding the agent's input,
    as its JSON Schema says) and what comes back."""
    answer = "" if agent.answer_model is None else (
        " The answer comes back as a data part of the artifact 'answer', as this JSON "
        "Schema says: "
        f"{orjson.dumps(agent.answer_model.model_json_schema(by_alias=True)).decode()}")
    return (f"{agent.description} Send a message with one data part holding the input, as "
            f"this JSON Schema says: {orjson.dumps(agent.input_schema()).decode()}.{answer} "
            "Every cycle of the agent's reasoning is kept as signed evidence; the artifact "
            "'evidence' says where to fetch its bundle and report.")


def _examples(agent: AgentProfile) -> list[Any]:
    extra = agent.input_model.model_config.get("json_schema_extra")
    found = extra.get("examples") if isinstance(extra, dict) else None
    return list(found) if isinstance(found, list) else []
