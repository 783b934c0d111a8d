"""A remote "KYC check" agent served by the official ``a2a-sdk`` server (its request
handler, task store and Starlette routes; nothing of casetrail's), for the tests of
remote A2A agents as tools (tests/integration/test_a2a_tools.py).

    python -m tests.plugins.a2a_remote PORT [--no-streaming] [--name NAME]

The message's data part holds ``{"customerId": ...}``; the task answers with one data
artifact ``{"customerId", "sanctionsHit", "checkedBy"}``. A customer id starting with
``ASK`` leaves the task waiting for input; one starting with ``DIE`` ends the whole
process mid-task (the server dies); one starting with ``SLOW`` takes two seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import uvicorn
from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value
from starlette.applications import Starlette


class KycCheck(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        task = context.current_task or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        data: dict[str, Any] = {}
        for part in MessageToDict(context.message).get("parts", []):
            data.update(part.get("data") or {"text": part.get("text", "")})
        customer = str(data.get("customerId", data.get("text", "")))
        if customer.startswith("DIE"):
            await asyncio.sleep(0.2)
            os._exit(1)  # the server dies with the task running
        if customer.startswith("ASK"):
            await updater.requires_input(updater.new_agent_message(
                [Part(text="which jurisdiction?")]))
            return
        if customer.startswith("SLOW"):
            await asyncio.sleep(2)
        answer = {"customerId": customer, "sanctionsHit": customer.startswith("S-"),
                  "checkedBy": "remote-kyc", "skill": context.metadata.get("skill")}
        await updater.add_artifact([Part(data=ParseDict(answer, Value()))], name="kyc")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def card(port: int, name: str, streaming: bool) -> AgentCard:
    url = f"http://127.0.0.1:{port}/"
    return AgentCard(
        name=name, description="Checks a customer against sanctions lists.", version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC",
                                             protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["application/json"],
        skills=[AgentSkill(id="sanctions", name="sanctions",
                           description="Whether a customer is on a sanctions list.",
                           tags=["kyc"])])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--no-streaming", action="store_true")
    parser.add_argument("--name", default="kyc-check")
    args = parser.parse_args()
    served = card(args.port, args.name, not args.no_streaming)
    handler = DefaultRequestHandler(agent_executor=KycCheck(), task_store=InMemoryTaskStore(),
                                    agent_card=served)
    app = Starlette(routes=[*create_agent_card_routes(served),
                            *create_jsonrpc_routes(handler, rpc_url="/")])
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
