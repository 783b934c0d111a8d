"""The OpenAPI document, made exact where FastAPI's generation cannot be.

FastAPI describes what the route signatures say. Four things a client needs to
know are decided elsewhere, so they are written in here, from the same data the
routes check against:

- the body of ``POST /cases`` is one of the agents: each agent's name with that
  agent's own input schema (``oneOf``, discriminated by ``agent``);
- the limits' caps and the model a case may choose (``latencyMs`` for the scripted
  provider in bench mode only; ``baseUrl`` only one the operator allowed) come from
  the settings, and so does whether the bench-only agent is offered;
- ``types`` on ``GET /cases/{case_id}/events`` is a comma-separated list of event
  types (an array, ``style: form``, ``explode: false``);
- the event streams answer their errors in JSON, before any stream starts.

The contract test (tests/integration/test_openapi_contract.py) runs schemathesis with every
check against a running stack, so a route that answers something this document
does not say fails the tests.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from casetrail.agents import AGENTS
from casetrail.api.problems import problem_media_types
from casetrail.cases.retention import PRESETS
from casetrail.config import Settings
from casetrail.contract.events import EVENT_TYPES
from casetrail.contract.model_providers import PROVIDERS

_REF = "#/components/schemas/{model}"


def _title(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def _limits(settings: Settings) -> dict[str, Any]:
    return {
        "type": "object", "additionalProperties": False,
        "description": "Overrides of the agent's default limits, within the server's caps.",
        "properties": {
            "maxCycles": {"anyOf": [{"type": "integer", "minimum": 1,
                                     "maximum": settings.max_cycles_cap}, {"type": "null"}]},
            "deadlineSeconds": {"anyOf": [{"type": "number", "exclusiveMinimum": 0,
                                           "maximum": settings.max_deadline_seconds},
                                          {"type": "null"}]},
            "maxAnswerRetries": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10},
                                           {"type": "null"}]},
        },
    }


def _model_choice(settings: Settings) -> dict[str, Any]:
    name = {"type": "string", "minLength": 1, "maxLength": 200}
    absent = {"type": "null"}
    # The scripted model's latencyMs only in bench mode (benchmarks and tests).
    latency = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 60_000}, absent]} \
        if settings.bench_mode else absent
    remotes = []
    for provider in PROVIDERS:
        # Only the endpoints the operator configured for this provider, by name or
        # by their exact baseUrl.
        names = sorted(e.name for e in settings.model_endpoints if e.provider == provider)
        urls = sorted(e.base_url for e in settings.model_endpoints if e.provider == provider)
        remotes.append({
            "type": "object", "additionalProperties": False, "required": ["provider", "name"],
            "properties": {
                "provider": {"const": provider}, "name": name, "latencyMs": absent,
                "endpoint": {"anyOf": [{"enum": names}, absent]} if names else absent,
                "baseUrl": {"anyOf": [{"enum": urls}, absent]} if urls else absent,
            }})
    return {
        "description": "Overrides the agent's model.",
        "oneOf": [
            {"type": "object", "additionalProperties": False, "required": ["provider", "name"],
             "properties": {"provider": {"const": "scripted"}, "name": name,
                            "endpoint": absent, "baseUrl": absent, "latencyMs": latency}},
            *remotes,
        ],
    }


def _input_defs() -> set[str]:
    """The names of the models nested in the agents' inputs."""
    return {name for agent in AGENTS.values()
            for name in agent.input_model.model_json_schema(by_alias=True).get("$defs", {})}


def _case_requests(schemas: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """``CaseRequest`` as one of the agents, each with its own input schema."""
    variants, mapping = [], {}
    for agent in AGENTS.values():
        if agent.bench_only and not settings.bench_mode:
            continue
        input_schema = agent.input_model.model_json_schema(by_alias=True, ref_template=_REF)
        schemas.update(input_schema.pop("$defs", {}))
        input_name = f"{_title(agent.name)}Input"
        schemas[input_name] = input_schema
        request_name = f"{_title(agent.name)}CaseRequest"
        schemas[request_name] = {
            "type": "object", "additionalProperties": False, "required": ["agent", "input"],
            "title": request_name, "description": agent.description,
            "properties": {
                "agent": {"const": agent.name},
                "input": {"$ref": _REF.format(model=input_name)},
                "limits": {"anyOf": [{"$ref": _REF.format(model="LimitsRequest")},
                                     {"type": "null"}]},
                "model": {"anyOf": [{"$ref": _REF.format(model="ModelChoice")},
                                    {"type": "null"}]},
            },
        }
        variants.append({"$ref": _REF.format(model=request_name)})
        mapping[agent.name] = _REF.format(model=request_name)
    return {"title": "CaseRequest", "description": "Start a case of one of the agents.",
            "oneOf": variants, "discriminator": {"propertyName": "agent", "mapping": mapping}}


_NO_NUL = {"pattern": "\\u0000"}


def _refuse_nul(schema: Any) -> None:
    """Every string a request body may hold: no NUL character (Postgres text cannot
    store one, so the API refuses it with 422)."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and "enum" not in schema and "const" not in schema:
            schema["not"] = _NO_NUL
        for value in schema.values():
            _refuse_nul(value)
    elif isinstance(schema, list):
        for item in schema:
            _refuse_nul(item)


def _backtest_request(schema: dict[str, Any]) -> None:
    """A backtest names installed agents only (a challenger by name or name@version), and
    its model as a case's is described."""
    _choice_for_ref(schema)
    properties = schema["properties"]
    properties["agent"] = {**properties["agent"], "enum": sorted(AGENTS)}
    properties["challenger"] = {
        "description": properties["challenger"].get("description", ""),
        "anyOf": [{"enum": sorted({*AGENTS, *(f"{a.name}@{a.version}"
                                              for a in AGENTS.values())})},
                  {"type": "null"}]}


def _choice_for_ref(schema: Any) -> None:
    """A model named elsewhere than a case's request: described by ModelChoice too."""
    if isinstance(schema, dict):
        if schema.get("$ref") == "#/components/schemas/ModelRef":
            schema["$ref"] = "#/components/schemas/ModelChoice"
        for value in schema.values():
            _choice_for_ref(value)
    elif isinstance(schema, list):
        for item in schema:
            _choice_for_ref(item)


def exact_openapi(app: FastAPI, settings: Settings) -> dict[str, Any]:
    """FastAPI's document with the parts above written in (built once, then cached)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(title=app.title, version=app.version,
                           description=app.description, routes=app.routes)
    schemas = document["components"]["schemas"]
    schemas["LimitsRequest"] = _limits(settings)
    schemas["ModelChoice"] = _model_choice(settings)
    schemas["CaseRequest"] = _case_requests(schemas, settings)
    del schemas["ModelRef"]  # described by ModelChoice now
    _backtest_request(schemas["BacktestRequest"])
    for name, schema in schemas.items():
        if name.endswith(("CaseRequest", "Input", "Choice")) or name in (
                "CancelRequest", "LimitsRequest", "BacktestRequest") or name in _input_defs():
            _refuse_nul(schema)
    events = document["paths"]["/cases/{case_id}/events"]["get"]
    events.setdefault("parameters", []).append({
        "name": "types", "in": "query", "required": False, "style": "form", "explode": False,
        "description": "Only these event types (comma-separated), e.g. "
                       "REACT_CYCLE,CASE_COMPLETED; all when absent.",
        "schema": {"type": "array", "items": {"enum": list(EVENT_TYPES)}},
    })
    search = document["paths"]["/cases"]["get"]
    for field in sorted({key for agent in AGENTS.values() for key in agent.keys}):
        search.setdefault("parameters", []).append({
            "name": f"key.{field}", "in": "query", "required": False,
            "description": f"Cases whose business key {field} has this value.",
            "schema": {"type": "string", "maxLength": 300, "not": _NO_NUL}})
    _retention_exact(document)
    _json_errors_on_streams(document)
    problem_media_types(document)
    app.openapi_schema = document
    return document


def _retention_exact(document: dict[str, Any]) -> None:
    """What retention and holds accept, as exactly as the installed agents make it: the
    agents a policy may name, the business key fields, the presets; no NUL in text."""
    schemas = document["components"]["schemas"]
    keys = sorted({key for agent in AGENTS.values() for key in agent.keys})
    for name in ("BusinessDateRequest", "HoldKey"):
        schemas[name]["properties"]["field"]["enum"] = keys
    policy = schemas["PolicyRequest"]["properties"]
    policy["businessKey"] = {"anyOf": [{"enum": keys}, {"type": "null"}],
                             "description": policy["businessKey"]["description"]}
    policy["preset"] = {"anyOf": [{"enum": list(PRESETS)}, {"type": "null"}],
                        "description": policy["preset"]["description"]}
    for parameter in document["paths"]["/retention/policies/{agent}"]["put"]["parameters"]:
        if parameter["name"] == "agent":
            parameter["schema"] = {"enum": [*sorted(AGENTS), "*"],
                                   "description": parameter["schema"].get("description", "")}
    for name in ("PolicyRequest", "BusinessDateRequest", "HoldKey", "HoldOnCase",
                 "HoldOnKey", "HoldOnTenant", "ReleaseRequest"):
        _refuse_nul(schemas[name])


_SSE_ITEM = {"type": "object", "properties": {
    "data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
    "retry": {"type": "integer", "minimum": 0}}}
"""One message of an event stream (OpenAPI 3.2's ``itemSchema`` of text/event-stream)."""


def _json_errors_on_streams(document: dict[str, Any]) -> None:
    """An event-stream route's 200 is a stream of messages (a route that writes its own
    response FastAPI describes as a string); its errors (401, 404, 422, ...) are
    answered in JSON before any stream starts, where FastAPI labels them with the
    stream's media type."""
    for operations in document["paths"].values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if "text/event-stream" not in responses.get("200", {}).get("content", {}):
                continue
            responses["200"]["description"] = "The event stream"
            stream = responses["200"]["content"]
            if stream["text/event-stream"] == {"schema": {"type": "string"}}:  # FastAPI's
                stream["text/event-stream"] = {"itemSchema": _SSE_ITEM}  # word for a body
            for parameter in operation.get("parameters", []):
                parameter["schema"].pop("default", None)  # absent means from the start
            for code, response in responses.items():
                content = response.get("content", {})
                if code != "200" and "text/event-stream" in content:
                    content["application/json"] = content.pop("text/event-stream")
