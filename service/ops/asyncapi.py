"""The bus as an AsyncAPI 3.0 document, generated from the models and the topology the
code itself uses (``GET /asyncapi.json``; ``docs/asyncapi.json`` for the default
namespace).

Channels are the exchanges with their routing keys, operations say who sends what,
and each message carries its payload schema (the pydantic models of
``casetrail.contract.events`` and ``casetrail.contract.commands``), its headers and its AMQP 0-9-1
bindings (AsyncAPI AMQP bindings 0.3.0). tests/unit/test_asyncapi.py validates the document
against the official AsyncAPI 3.0.0 JSON schema and fails when an event type or a
field changes without docs/asyncapi.json changing with it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from casetrail.adapters.bus.topology import Topology
from casetrail.agents import AGENTS
from casetrail.contract.commands import (
    CancelCommand,
    CaseStartCommand,
    EraseCommand,
    ToolReply,
    ToolRequest,
)
from casetrail.contract.events import EVENT_TYPES, TERMINAL_EVENT_TYPES, event_class

AMQP_BINDING = "0.3.0"
_REF = "#/components/schemas/{model}"


def _title(event_type: str) -> str:
    return "".join(part.capitalize() for part in event_type.split("_"))


def _schemas(models: list[type[BaseModel]]) -> dict[str, Any]:
    """Each model's JSON schema as it is written on the wire (camelCase; durations as
    integer milliseconds), nested ones hoisted."""
    schemas: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(by_alias=True, ref_template=_REF,
                                         mode="serialization")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def _answers() -> dict[str, Any]:
    """Each agent's answer schema (``<Agent>Answer``): what a ``REACT_CYCLE``'s
    ``answer`` and a ``CASE_COMPLETED``'s ``answer`` hold for a case of that agent."""
    schemas: dict[str, Any] = {}
    for agent in AGENTS.values():
        if agent.answer_model is None:
            continue
        schema = agent.answer_model.model_json_schema(by_alias=True, ref_template=_REF)
        schemas.update(schema.pop("$defs", {}))
        title = "".join(part.capitalize() for part in agent.name.split("-"))
        schemas[f"{title}Answer"] = {**schema, "description": (
            f"The answer of a case of agent {agent.name} (v{agent.version}).")}
    return schemas


def _exchange(name: str, kind: str, vhost: str) -> dict[str, Any]:
    return {"amqp": {"is": "routingKey", "exchange": {
        "name": name, "type": kind, "durable": True, "autoDelete": False, "vhost": vhost},
        "bindingVersion": AMQP_BINDING}}


def _message(name: str, title: str, model: str, summary: str, *,
             headers: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "name": name, "title": title, "summary": summary, "contentType": "application/json",
        "payload": {"$ref": _REF.format(model=model)},
        "bindings": {"amqp": {"messageType": name, "bindingVersion": AMQP_BINDING}},
    }
    if headers is not None:
        message["headers"] = headers
    return message


_INTEGRITY_HEADERS = {
    "type": "object", "required": ["x-casetrail-integrity"],
    "properties": {"x-casetrail-integrity": {
        "type": "object", "required": ["prevHash", "hash", "keyId", "sig"],
        "description": "hash = SHA-256(prevHash || 0x0A || body); sig = Ed25519 over the "
                       "hash, by the worker key keyId (GET /signing-keys).",
        "properties": {"prevHash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                       "hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                       "keyId": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
                       "sig": {"type": "string", "pattern": "^[A-Za-z0-9_-]{86}$"}}}},
}


def _send(channel: str, messages: list[str], summary: str, *, user: str,
          reply: str | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "action": "send", "channel": {"$ref": f"#/channels/{channel}"}, "summary": summary,
        "messages": [{"$ref": f"#/channels/{channel}/messages/{m}"} for m in messages],
        "bindings": {"amqp": {"deliveryMode": 2, "mandatory": False, "userId": user,
                              "bindingVersion": AMQP_BINDING}},
    }
    if reply is not None:
        operation["reply"] = {"channel": {"$ref": f"#/channels/{reply}"}}
    return operation


def asyncapi_document(namespace: str, vhost: str = "/", host: str = "localhost:5672"
                      ) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of the namespace's bus."""
    topology = Topology(namespace)
    events = {_title(t): _message(
        t, t, event_class(t).__name__,
        ("A terminal event: exactly one per case. " if t in TERMINAL_EVENT_TYPES else "")
        + (event_class(t).__doc__ or t).strip().splitlines()[0],
        headers=_INTEGRITY_HEADERS) for t in EVENT_TYPES}
    commands = {
        "CaseStart": _message(CaseStartCommand.MESSAGE_TYPE, "Start a case", "CaseStartCommand",
                              "Run this case (the worker reads the rest from its row)."),
        "CaseErase": _message(EraseCommand.MESSAGE_TYPE, "Erase a case", "EraseCommand",
                              "Erase the case's sensitive values as the signed erasure asks: "
                              "the worker appends CASE_ERASED, whose storing shreds them."),
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "casetrail bus", "version": "0.1.0",
            "description": "Every cycle of every case, as JSON on RabbitMQ. Event bodies are "
                           "RFC 8785 canonical JSON of the envelope without `integrity` "
                           "(which travels in the x-casetrail-integrity header); only the "
                           "worker's broker user may publish them (user_id is set).",
        },
        "defaultContentType": "application/json",
        "servers": {"rabbitmq": {"host": host, "protocol": "amqp", "protocolVersion": "0-9-1",
                                 "description": "RabbitMQ; every name carries the namespace "
                                                f"prefix `{namespace}.`"}},
        "channels": {
            "caseEvents": {
                "address": "case.{tenantId}.{caseId}.{eventType}",
                "title": f"{topology.events_exchange} (topic)",
                "description": "Bind `case.*.*.REACT_CYCLE` for every cycle, "
                               "`case.<tenantId>.#` for one tenant, `case.*.<caseId>.#` for "
                               "one case.",
                "parameters": {
                    "tenantId": {"description": "The case's tenant ([a-z0-9][a-z0-9-]{0,39})."},
                    "caseId": {"description": "The case's UUID."},
                    "eventType": {"enum": list(EVENT_TYPES), "description": "The event type."},
                },
                "messages": {name: {"$ref": f"#/components/messages/{name}"} for name in events},
                "bindings": _exchange(topology.events_exchange, "topic", vhost),
            },
            "checkpoints": {
                "address": Topology.CHECKPOINT_KEY,
                "title": f"{topology.events_exchange} (topic)",
                "description": "The transparency log's signed checkpoints (a new one whenever "
                               "the tree grew, at most every CASETRAIL_CHECKPOINT_SECONDS), "
                               f"also kept in the stream {topology.checkpoints_stream} for "
                               "witnesses to read from any offset.",
                "messages": {"Checkpoint": {"$ref": "#/components/messages/Checkpoint"}},
                "bindings": _exchange(topology.events_exchange, "topic", vhost),
            },
            "caseCommands": {
                "address": "{command}", "title": f"{topology.commands_exchange} (direct)",
                "description": f"Bound to the quorum queue {topology.case_start_queue}.",
                "parameters": {"command": {"enum": [Topology.START_KEY, Topology.ERASE_KEY]}},
                "messages": {name: {"$ref": f"#/components/messages/{name}"}
                             for name in commands},
                "bindings": _exchange(topology.commands_exchange, "direct", vhost),
            },
            "cancels": {
                "address": None, "title": f"{topology.cancel_exchange} (fanout)",
                "description": "Each worker binds an exclusive queue and stops the case if it "
                               "runs it, once Postgres confirms the request.",
                "messages": {"Cancel": {"$ref": "#/components/messages/Cancel"}},
                "bindings": {"amqp": {"is": "routingKey", "exchange": {
                    "name": topology.cancel_exchange, "type": "fanout", "durable": True,
                    "autoDelete": False, "vhost": vhost}, "bindingVersion": AMQP_BINDING}},
            },
            "toolRequests": {
                "address": "{capability}",
                "title": f"{topology.capabilities_exchange} (direct)",
                "description": f"One quorum queue per capability, "
                               f"{topology.capability_queue('<capability>')}.",
                "parameters": {"capability": {"description": "The capability's name."}},
                "messages": {"ToolRequest": {"$ref": "#/components/messages/ToolRequest"}},
                "bindings": _exchange(topology.capabilities_exchange, "direct", vhost),
            },
            "toolReplies": {
                "address": "{replyQueue}",
                "title": f"{topology.replies_exchange} (direct)",
                "description": "Keyed by the caller's exclusive queue "
                               f"{namespace}.reply.<hex> (bound by its name), correlated by "
                               "a random token; never through the default exchange.",
                "parameters": {"replyQueue": {"description": "reply_to of the request."}},
                "messages": {"ToolReply": {"$ref": "#/components/messages/ToolReply"}},
                "bindings": _exchange(topology.replies_exchange, "direct", vhost),
            },
            "deadLetters": {
                "address": None, "title": f"{topology.dead_letter_exchange} (fanout)",
                "description": "Whatever could not be processed, with the reason in "
                               f"x-casetrail-reason; kept in {topology.dead_letter_queue}.",
                "messages": {"DeadLetter": {"$ref": "#/components/messages/DeadLetter"}},
                "bindings": {"amqp": {"is": "routingKey", "exchange": {
                    "name": topology.dead_letter_exchange, "type": "fanout", "durable": True,
                    "autoDelete": False, "vhost": vhost}, "bindingVersion": AMQP_BINDING}},
            },
        },
        "operations": {
            "publishCaseEvent": _send("caseEvents", list(events),
                                      "The worker publishes each event the moment it happens "
                                      "(confirmed, persistent).", user=f"{namespace}-worker"),
            "receiveCaseEvents": {
                "action": "receive", "channel": {"$ref": "#/channels/caseEvents"},
                "summary": "Subscribers: the event-log consumer, the API's streams, yours.",
                "messages": [{"$ref": f"#/channels/caseEvents/messages/{m}"} for m in events],
            },
            "publishCheckpoint": _send("checkpoints", ["Checkpoint"], "The ledger publishes "
                                       "each checkpoint it signs.", user=f"{namespace}-ledger"),
            "sendCaseCommand": _send("caseCommands", list(commands),
                                     "The API starts (and the operator erases) cases.",
                                     user=f"{namespace}-api"),
            "sendCancel": _send("cancels", ["Cancel"], "The API asks the workers to stop a "
                                "case.", user=f"{namespace}-api"),
            "requestTool": _send("toolRequests", ["ToolRequest"], "The worker asks a "
                                 "capability worker to run a tool (one message per attempt).",
                                 user=f"{namespace}-worker", reply="toolReplies"),
            "replyTool": _send("toolReplies", ["ToolReply"], "A capability worker answers.",
                               user=f"{namespace}-capability-<capability>"),
            "deadLetter": _send("deadLetters", ["DeadLetter"], "A component sets a message "
                                "aside with the reason.", user=f"{namespace}-<component>"),
        },
        "components": {
            "schemas": {
                **_schemas([*(event_class(t) for t in EVENT_TYPES), CaseStartCommand,
                            EraseCommand, CancelCommand, ToolRequest, ToolReply]),
                "AnyMessage": {"description": "The original message's body, unchanged."},
                **_answers(),
            },
            "messages": {
                **events, **commands,
                "Cancel": _message(CancelCommand.MESSAGE_TYPE, "Cancel a case", "CancelCommand",
                                   "Stop this case if you run it."),
                "ToolRequest": _message("TOOL_REQUEST", "Tool request", "ToolRequest",
                                        "One attempt of a worker tool call.",
                                        headers={"type": "object", "properties": {
                                            "x-idempotency-key": {"type": "string"}}}),
                "ToolReply": _message("TOOL_REPLY", "Tool reply", "ToolReply",
                                      "The capability worker's answer to one attempt."),
                "Checkpoint": {
                    "name": "LEDGER_CHECKPOINT", "title": "Signed checkpoint",
                    "summary": "A c2sp.org/tlog-checkpoint (origin, tree size, base64 root) in "
                               "a c2sp.org/signed-note with the log's Ed25519 signature.",
                    "contentType": "text/plain",
                    "payload": {"type": "string"},
                },
                "DeadLetter": {
                    "name": "DEAD_LETTER", "title": "Dead letter",
                    "summary": "A message set aside, unchanged, with why and where from.",
                    "payload": {"$ref": _REF.format(model="AnyMessage")},
                    "headers": {"type": "object", "required": ["x-casetrail-reason"],
                                "properties": {
                                    "x-casetrail-reason": {"type": "string"},
                                    "x-original-exchange": {"type": "string"},
                                    "x-original-routing-key": {"type": "string"}}},
                },
            },
        },
    }


if __name__ == "__main__":  # regenerate docs/asyncapi.json: python -m casetrail.ops.asyncapi
    import orjson

    print(orjson.dumps(asyncapi_document("casetrail"), option=orjson.OPT_INDENT_2).decode())
