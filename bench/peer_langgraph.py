"""The peer: LangGraph's ReAct agent with its Postgres checkpointer, zero-latency model.

Runs in its own virtual environment (``bench/.venv-peer``), never the project's.
Prints one JSON line: cases, cycles, seconds, cycles per second.

Usage: python bench/peer_langgraph.py DATABASE_URL CASES CYCLES CONCURRENCY
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.prebuilt import create_react_agent


@tool
def tick(n: int) -> dict[str, int]:
    """Counts one."""
    return {"n": n, "next": n + 1}


class ScriptedChatModel(BaseChatModel):
    """The same script as casetrail's throughput probe: ``cycles`` turns, each a tool
    call but the last, which answers. Zero latency."""

    cycles: int = 10

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _turn(self, messages: list[BaseMessage]) -> ChatResult:
        done = sum(isinstance(m, ToolMessage) for m in messages)
        if done + 1 >= self.cycles:
            message = AIMessage(content=json.dumps({"ticks": done}))
        else:
            message = AIMessage(content=f"Tick {done}.", tool_calls=[
                {"name": "tick", "args": {"n": done}, "id": f"t{done}", "type": "tool_call"}])
        message.usage_metadata = {"input_tokens": 10 * (done + 1), "output_tokens": 5,
                                  "total_tokens": 10 * (done + 1) + 5}
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        return self._turn(messages)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        return self._turn(messages)


async def main(url: str, cases: int, cycles: int, concurrency: int) -> None:
    async with AsyncPostgresSaver.from_conn_string(url) as saver:
        await saver.setup()
        agent = create_react_agent(ScriptedChatModel(cycles=cycles), [tick],
                                   checkpointer=saver)
        gate = asyncio.Semaphore(concurrency)
        counted = 0

        async def one() -> None:
            nonlocal counted
            async with gate:
                config = {"configurable": {"thread_id": str(uuid.uuid4())}}
                state = await agent.ainvoke({"messages": [("user", "start")]}, config)
                counted += sum(isinstance(m, AIMessage) for m in state["messages"])

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(cases)))
        seconds = time.perf_counter() - started
    print(json.dumps({"cases": cases, "cyclesPerCase": cycles, "cycles": counted,
                      "concurrency": concurrency, "seconds": round(seconds, 3),
                      "cyclesPerSecond": round(counted / seconds, 1)}))


if __name__ == "__main__":
    url, cases, cycles, concurrency = sys.argv[1], *map(int, sys.argv[2:5])
    asyncio.run(main(url, cases, cycles, concurrency))
