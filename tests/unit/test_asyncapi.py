"""The AsyncAPI 3.0 document of the bus: valid against the official schema (vendored
from the ``@asyncapi/specs`` npm package, 6.11.1, Apache-2.0), kept in step with the
code (docs/asyncapi.json), served by the API, and true of what really crosses the bus."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema_rs
import pytest

from casetrail.contract.events import EVENT_TYPES
from casetrail.ops.asyncapi import asyncapi_document
from tests.support import ROOT
from tests.support.asyncapi import payload_validator

SPEC = json.loads((ROOT / "tests" / "data" / "asyncapi-3.0.0.schema.json").read_text())



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








@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_each_event_schema_refuses_an_unknown_field(event_type: str) -> None:
    document = asyncapi_document("casetrail")
    validator = payload_validator(document, event_type)
    assert not validator.is_valid({"eventType": event_type, "surprise": 1})
