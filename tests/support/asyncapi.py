"""Reading the AsyncAPI document as a consumer of the bus would."""

from __future__ import annotations

from typing import Any

import jsonschema_rs


def payload_validator(document: dict[str, Any], event_type: str) -> Any:
    """A JSON Schema validator for ``event_type``'s payload, as the document gives it."""
    message = next(m for m in document["components"]["messages"].values()
                   if m["name"] == event_type)
    return jsonschema_rs.validator_for({**message["payload"],
                                        "components": document["components"]})
