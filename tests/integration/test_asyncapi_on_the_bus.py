"""What really crosses the bus matches the AsyncAPI document the API serves."""

from __future__ import annotations

import json
from typing import Any

import aio_pika
import httpx

from casetrail.agents.loan_officer import SAMPLE_APPLICATIONS
from casetrail.config import Settings
from casetrail.ops.asyncapi import asyncapi_document
from tests.support.asyncapi import payload_validator
from tests.support.helpers import drain, ended
from tests.support.stack import InProcessStack, module_stack

stack = module_stack(worker_concurrency=4)


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
        errors = list(payload_validator(served, message.type or "").iter_errors(body))
        assert errors == [], (message.type, [e.message for e in errors])
        headers = served["components"]["messages"]["ReactCycle"]["headers"]
        assert set(headers["required"]) <= set(message.headers)


async def _rest(queue: aio_pika.abc.AbstractQueue) -> list[Any]:
    got = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        got.append(message)
    return got
