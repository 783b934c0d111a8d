"""``throughput-probe``: a synthetic agent for benchmarks and load tests.

It runs exactly ``cycles`` cycles, each calling one local tool, then answers.
Its scripted model takes no time (or ``latencyMs``), so what is measured is
casetrail itself: the loop, the bus, the consumer and Postgres.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from casetrail.agents.profile import AgentProfile, CamelModel, case_input
from casetrail.contract.events import Limits, ModelRef
from casetrail.engine.answers import FINAL_ANSWER
from casetrail.engine.chat import AssistantTurn, ChatMessage, ToolResultMessage
from casetrail.engine.scripted import call
from casetrail.engine.tools import LocalTool


class ProbeInput(CamelModel):
    model_config = CamelModel.model_config | {"json_schema_extra": {"examples": [{"cycles": 5}]}}

    cycles: int = Field(ge=1, le=200, description="Cycles before the answer, the last "
                        "included (beyond the agent's 50, ask for limits.maxCycles too).")
    result_bytes: int = Field(default=0, ge=0, le=100_000, description="Bytes of padding "
                              "in each tool result (how cost grows with what tools return).")


class TickArgs(CamelModel):
    n: int = Field(ge=0)
    pad: int = Field(default=0, ge=0, le=100_000)


def tick(args: TickArgs) -> dict[str, Any]:
    if args.pad:
        return {"n": args.n, "next": args.n + 1, "pad": "x" * args.pad}
    return {"n": args.n, "next": args.n + 1}


async def tick_async(args: TickArgs) -> dict[str, Any]:
    return tick(args)


class ProbeAnswer(CamelModel):
    ticks: int = Field(ge=0, description="The ticks counted.")


def think(messages: Sequence[ChatMessage]) -> AssistantTurn:
    given = case_input(messages)
    done = sum(isinstance(m, ToolResultMessage) for m in messages)
    if done + 1 >= given["cycles"]:
        return AssistantTurn(text=f"{done} ticks.",
                             tool_calls=(call(FINAL_ANSWER, "final", ticks=done),))
    padding = {"pad": given["resultBytes"]} if given.get("resultBytes") else {}
    return AssistantTurn(text=f"Tick {done}.",
                         tool_calls=(call("tick", f"t{done}", n=done, **padding),))


THROUGHPUT_PROBE = AgentProfile(
    name="throughput-probe",
    bench_only=True,
    description="Synthetic agent for benchmarks: N cycles of a local tool, then an answer.",
    system_prompt="Call tick until told otherwise.",
    tools=(LocalTool("tick", "Counts one.", TickArgs, tick_async),),
    input_model=ProbeInput,
    default_model=ModelRef(provider="scripted", name="probe-scripted"),
    default_limits=Limits(max_cycles=50, deadline_seconds=120),
    script=think,
    answer_model=ProbeAnswer,
)
