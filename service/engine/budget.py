"""A turn's tool results within what one event may hold (docs/design.md, "Tool results
have a budget").

A ``REACT_CYCLE`` carries every result of its turn, and no event may exceed the event
size limit (``MAX_EVENT_BYTES``, or the deployment's lower ``CASETRAIL_MAX_EVENT_BYTES``):
a consumer refuses a larger one. So before a turn is recorded, the largest results are
replaced, one by one, by a tool error naming their size and SHA-256 until the rest fit.
The model sees that error (it may ask for less); the trail records the call, the error
and nothing of the result, and the attempt goes on.

The measure is the result's JSON as the model sees it (what the event serializes too)
with room for the rest of the event: the reasoning, the arguments and the envelope.
Counting characters first costs nothing on the common path; bytes are counted only when
a turn comes near the limit. No I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from casetrail.engine.chat import ToolResultMessage
from casetrail.engine.tools import ToolOutcome

ENVELOPE_ROOM = 64 * 1024
"""Room kept for the event's envelope, its other fields and the placeholders that
replace a case's sensitive values (which may be longer than the values)."""


def within_budget(outcomes: Sequence[ToolOutcome], limit: int, reasoning: str
                  ) -> list[ToolOutcome]:
    """``outcomes`` with the largest results turned into tool errors until the turn's
    event fits ``limit`` bytes."""
    room = limit - ENVELOPE_ROOM
    if 4 * (len(reasoning) + sum(_chars(o) for o in outcomes)) <= room:
        return list(outcomes)  # even all in 4-byte characters it fits
    sizes = [_bytes(o) for o in outcomes]
    total = len(reasoning.encode()) + sum(sizes)
    kept = list(outcomes)
    for index in sorted(range(len(kept)), key=lambda i: sizes[i], reverse=True):
        if total <= room:
            break
        if kept[index].record.error is None:
            kept[index] = _too_big(kept[index], limit)
            total -= sizes[index] - _bytes(kept[index])
    return kept


def _chars(outcome: ToolOutcome) -> int:
    return len(outcome.observation.content) + len(outcome.record.raw_args or "") + \
        _args_chars(outcome)


def _args_chars(outcome: ToolOutcome) -> int:
    # The arguments as the model gave them: their JSON is not kept, so measured loosely
    # (a model's arguments are small beside a result that could fill an event).
    return sum(len(str(k)) + len(str(v)) + 6 for k, v in outcome.record.tool_args.items())


def _bytes(outcome: ToolOutcome) -> int:
    return len(outcome.observation.content.encode()) + len(
        (outcome.record.raw_args or "").encode()) + _args_chars(outcome) * 4


def _too_big(outcome: ToolOutcome, limit: int) -> ToolOutcome:
    """The call as a tool error naming its result's size and SHA-256."""
    data = outcome.observation.content.encode()
    error = (f"the tool's result is {len(data):,} bytes of JSON (SHA-256 "
             f"{hashlib.sha256(data).hexdigest()}), more than one event may hold "
             f"({limit:,} bytes with the rest of the turn): it is neither recorded nor shown; "
             "ask for less")
    record = outcome.record.model_copy(update={"tool_result": None, "error": error})
    observation = ToolResultMessage(outcome.observation.tool_call_id,
                                    outcome.observation.tool_name, f"ERROR: {error}",
                                    is_error=True)
    return ToolOutcome(record, observation)
