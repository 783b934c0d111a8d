"""Where the CPU of a durable cycle goes: the end-to-end scenario (bench/e2e.py) with
py-spy sampling the API, the worker and the consumer, summarised as each process's
costliest functions by the share of its samples spent in them (self) and under them
(inclusive, casetrail's own code only).

    python -m bench.profile [cases] [cycles]      # default 2000 cases of 10 cycles
    python -m bench.profile models [provider] [concurrency]

The second samples the worker alone while 1,000 loan cases speak a real provider's wire
format to the 300 ms model (bench/models.py).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench import models
from bench.e2e import end_to_end
from bench.slow_model import Provider

OURS = ("service/", "consumers/")
ENTRY = ("service/cli/main.py", "service/components/supervisor.py",
         "service/adapters/bus/probe.py", "service/components/runtime.py")
"""Frames every sample passes through (the command, its supervisor): not worth a row."""


def _frames(stack: str) -> list[str]:
    """``function (file:line)`` frames of one collapsed stack, outermost first, with the
    line dropped so that one function is one row."""
    return [f.rsplit(":", 1)[0] + ")" if ":" in f else f for f in stack.split(";")]


def summary(raw: Path, top: int = 12) -> tuple[int, list[tuple[str, float]],
                                                 list[tuple[str, float]]]:
    """Samples, the top functions by self share, the top own functions by inclusive."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = _frames(stack)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            if any(part in frame for part in OURS) and not any(e in frame for e in ENTRY):
                inclusive[frame] += n
    def share(counted: Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * k / max(total, 1), 1)) for f, k in counted.most_common(top)]

    return total, share(own), share(inclusive)


def report(directory: Path, names: tuple[str, ...]) -> None:
    for name in names:
        raw = directory / f"{name}.txt"
        if not raw.exists():
            print(f"\n{name}: no samples (py-spy could not attach)")
            continue
        total, by_self, by_inclusive = summary(raw)
        print(f"\n## {name}: {total} samples\n\nself %  function")
        for frame, pct in by_self:
            print(f"{pct:6.1f}  {frame}")
        print("\ninclusive %  casetrail function")
        for frame, pct in by_inclusive:
            print(f"{pct:6.1f}  {frame}")
    print(f"\nraw stacks: {directory}")


async def end_to_end_profile(cases: int, cycles: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="casetrail-profile-"))
    figures = await end_to_end(cases, cycles, profile=directory)
    per_cycle = {n: round(1e6 * s / figures["cycles"]) for n, s in figures["cpuSeconds"].items()}
    print(f"{figures['cycles']} cycles, {figures['cyclesPerSecond']} cycles/s; CPU-µs per "
          f"cycle: {per_cycle} (total {sum(per_cycle.values())})")
    report(directory, ("api", "worker-0", "consumer"))


async def models_profile(provider: Provider, concurrency: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="casetrail-profile-"))
    run = await models.run_cases(provider, 1000, concurrency, profile=directory)
    print(f"{provider}, 1,000 loan cases at concurrency {concurrency}: "
          f"{run['shareOfIdeal']:.0%} of ideal; worker {run['workerCpuSeconds']} CPU-s, "
          f"{run['workerCpuSeconds'] / max(run.get('turns') or 1, 1) * 1e6:,.0f} µs a model "
          "turn")
    report(directory, ("worker",))


if __name__ == "__main__":
    if sys.argv[1:2] == ["models"]:
        provider: Provider = "anthropic" if sys.argv[2:3] == ["anthropic"] else "openai"
        asyncio.run(models_profile(provider, int(sys.argv[3]) if len(sys.argv) > 3 else 256))
    else:
        arguments = [int(a) for a in sys.argv[1:3]]
        asyncio.run(end_to_end_profile(*(arguments + [2000, 10][len(arguments):])))
