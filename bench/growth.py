"""How the cost of a durable cycle grows with the work (the end-to-end scenario of
bench/e2e.py, every feature on): cases of 10, 50 and 200 cycles, and tool results of 1,
10 and 100 KB. Each row: cycles/s and CPU-µs per cycle, in total and per process. The
same against a long history: bench/history.py; resuming long cases: bench/resume.py.

    python -m bench.growth
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.e2e import end_to_end

SHAPES = [  # (label, cases, cycles, result bytes): about 10,000 cycles a row
    ("10 cycles a case", 1000, 10, 0),
    ("50 cycles a case", 200, 50, 0),
    ("200 cycles a case", 50, 200, 0),
    ("tool results of 1 KB", 1000, 10, 1_000),
    ("tool results of 10 KB", 1000, 10, 10_000),
    ("tool results of 100 KB", 200, 10, 100_000),
]


async def measure(scale: float = 1.0) -> list[dict[str, Any]]:
    """Every shape's end-to-end figures (cases scaled by ``scale``), labelled."""
    measured = []
    for label, cases, cycles, result_bytes in SHAPES:
        print(f"  {label} ...", flush=True)
        figures = await end_to_end(max(int(cases * scale), 5), cycles,
                                   result_bytes=result_bytes)
        measured.append({"work": label, **figures})
    return measured


def row(label: str, figures: dict[str, Any]) -> str:
    per = {n: 1e6 * s / figures["cycles"] for n, s in figures["cpuSeconds"].items()}
    parts = ", ".join(f"{n} {v:,.0f}" for n, v in per.items())
    return (f"| {label} | {figures['cycles']:,} | {figures['cyclesPerSecond']:,.0f} | "
            f"{sum(per.values()):,.0f} | {parts} |")


async def main() -> None:
    print("| work | cycles | cycles/s | CPU-µs per cycle | per process |")
    print("|---|---|---|---|---|")
    for label, cases, cycles, result_bytes in SHAPES:
        figures = await end_to_end(cases, cycles, result_bytes=result_bytes)
        print(row(label, figures), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
