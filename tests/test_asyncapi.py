"""The AsyncAPI 3.0 document of the bus: valid against the official schema (vendored
from the ``@asyncapi/specs`` npm package, 6.11.1, Apache-2.0), kept in step with the
code (docs/asyncapi.json), served by the API, and true of what really crosses the bus."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import jsonschema_rs
import pytest

from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from casetrail.contract.events import EVENT_TYPES
from casetrail.ops.asyncapi import asyncapi_document
from tests.helpers import drain, ended
from tests.stack import InProcessStack, module_stack

ROOT = Path(__file__).resolve().parent.parent
SPEC = json.loads((ROOT / "tests" / "data" / "asyncapi-3.0.0.schema.json").read_text())

stack = module_stack(worker_concurrency=4)


def spec_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema_rs.Draft7Validator(SPEC)
    return [f"{list(e.instance_path)}: {e.message[:200]}" for e in validator.iter_errors(document)]


def test_the_document_is_valid_asyncapi_3() -> None:
    document = asyncapi_document("casetrail")
    assert spec_errors(document) == []
    broken = copy.deepcopy(document)
    broken["channels"]["caseEvents"]["bindings"]["amqp"]["is"] = "topic"  # not an AMQP "is"
    assert spec_errors(broken)  # the validator does check


def test_docs_asyncapi_json_is_the_generated_document() -> None:
    """Regenerate with `python -m casetrail.ops.asyncapi > docs/asyncapi.json` after changing an
    event, a command or the topology."""
    kept = json.loads((ROOT / "docs" / "asyncapi.json").read_text())
    assert kept == json.loads(json.dumps(asyncapi_document("casetrail")))


def test_every_event_type_is_a_message_of_the_events_channel() -> None:
    document = asyncapi_document("casetrail")
    names = {m["name"] for m in document["components"]["messages"].values()}
    assert set(EVENT_TYPES) <= names
    channel = document["channels"]["caseEvents"]
    assert channel["parameters"]["eventType"]["enum"] == list(EVENT_TYPES)
    assert channel["bindings"]["amqp"]["exchange"] == {
        "name": "casetrail.events", "type": "topic", "durable": True, "autoDelete": False,
        "vhost": "/"}


def _payload_validator(document: dict[str, Any], event_type: str) -> Any:
    message = next(m for m in document["components"]["messages"].values()
                   if m["name"] == event_type)
    return jsonschema_rs.validator_for({**message["payload"],
                                        "components": document["components"]})


async def test_what_crosses_the_bus_matches_the_served_document(
    stack: InProcessStack, client: httpx.AsyncClient, settings: Settings,
    amqp: aio_pika.abc.AbstractRobustConnection,
) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url) as anonymous:
        served = (await anonymous.get("/asyncapi.json")).json()  # public
    assert served == json.loads(json.dumps(asyncapi_document(settings.namespace)))
    channel = await amqp.channel()
    exchange = await channel.get_exchange(f"{settings.namespace}.events", ensure=False)
    tap = await channel.declare_queue(exclusive=True, auto_delete=True)
    await tap.bind(exchange, routing_key="case.#")
    case_id = (await client.post("/cases", json={"agent": "loan-officer",
                                                 "input": SAMPLE_APPLICATIONS[1]})
               ).json()["caseId"]
    await ended(client, case_id)
    messages = [m for m in [*await drain(tap, 1), *await _rest(tap)]
                if m.correlation_id == case_id]
    # A-1002 is referred: the attempt ends waiting for a person.
    assert [m.type for m in messages] == ["CASE_STARTED", *["REACT_CYCLE"] * 4,
                                          "CASE_AWAITING_REVIEW"]
    for message in messages:
        body = json.loads(message.body)
        errors = list(_payload_validator(served, message.type or "").iter_errors(body))
        assert errors == [], (message.type, [e.message for e in errors])
        headers = served["components"]["messages"]["ReactCycle"]["headers"]
        assert set(headers["required"]) <= set(message.headers)


async def _rest(queue: aio_pika.abc.AbstractQueue) -> list[Any]:
    got = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        got.append(message)
    return got


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_each_event_schema_refuses_an_unknown_field(event_type: str) -> None:
    document = asyncapi_document("casetrail")
    validator = _payload_validator(document, event_type)
    assert not validator.is_valid({"eventType": event_type, "surprise": 1})
