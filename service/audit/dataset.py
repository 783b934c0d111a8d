"""Evaluation datasets from the record (docs/backtests.md, "Datasets"): one decided case
a line of JSONL, in the shape evaluation tools read without glue — ``input``,
``output`` (the agent's answer) and, for a case a person reviewed, ``expectedOutput``
(the reviewer's final decision: a confirmation and an override alike) — with what the
decision rests on: the tool calls and their recorded results, the review's verdict and
reason, the agent's version and digest. The format's JSON Schema is
``docs/dataset.schema.json`` (``DATASET_FORMAT``).

Sensitive input values stay placeholders (``[pii:applicantName]``): the trail holds no
other, and a dataset is copied where erasure cannot follow.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from casetrail.audit.backtest import decision_events
from casetrail.audit.resume import RecordedEvent, final_chain
from casetrail.contract.events import PARKING_EVENT_TYPE

DATASET_FORMAT = "casetrail-dataset/1"


def _call(cycle: Mapping[str, Any], call: Mapping[str, Any]) -> dict[str, Any]:
    return {"cycle": cycle.get("cycleIndex"), "toolName": call.get("toolName"),
            "toolArgs": call.get("toolArgs"), "source": call.get("toolSource"),
            **({"error": call["error"]} if call.get("error") is not None
               else {"toolResult": call.get("toolResult")})}


def _review(events: Sequence[RecordedEvent]) -> dict[str, Any] | None:
    reviews = [e for e in events if e.event_type == "CASE_REVIEWED"]
    if not reviews:
        return None
    last = reviews[-1].payload
    return {"verdict": last.get("verdict"), "reason": last.get("reason"),
            "reviewer": (last.get("reviewer") or {}).get("subject"),
            "reviewedAt": last.get("reviewedAt")}


def dataset_record(case_id: uuid.UUID, events: Sequence[RecordedEvent]
                   ) -> dict[str, Any] | None:
    """One case's line, or ``None`` when the agent has not decided it (no answer)."""
    if not events or events[0].event_type != "CASE_STARTED":
        return None
    started = events[0].payload
    terminal, waited = decision_events(events)
    output = (waited or terminal).payload.get("answer")
    if output is None:
        return None
    review = _review(events)
    expected = terminal.payload.get("answer") \
        if review is not None and terminal.event_type == "CASE_COMPLETED" else None
    return {
        "format": DATASET_FORMAT, "caseId": str(case_id), "agent": started.get("agent"),
        "agentVersion": started.get("agentVersion"), "agentDigest": started.get("agentDigest"),
        "createdAt": events[0].occurred_at.isoformat(),
        "input": started.get("input"),
        "toolCalls": [_call(cycle, call) for cycle in final_chain(events)
                      for call in cycle.get("toolCalls") or []],
        "output": output, "expectedOutput": expected, "review": review,
        "status": "awaiting_review" if terminal.event_type == PARKING_EVENT_TYPE
        else terminal.event_type.removeprefix("CASE_").lower(),
    }
