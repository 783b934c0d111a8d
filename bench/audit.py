"""What `casetrail audit` costs: a log of real, signed, logged cases (the end-to-end
scenario's), one full pass and one incremental pass after it, timed and in CPU seconds
of this process (the trails' verification; Postgres's share, the joins and reads, is in
the wall time: its backends end with the pass, before their CPU could be read); then a
pass whose scrub may run until it has come round the whole log, for the scrub's cost per
event (wall time, which is what its budget is counted in) and how long a lap of 25 M
events takes at the default budget under `up`.

The log is seeded in rounds of at most ``ROUND`` cases, each an end-to-end run of its
own, so that a log of a million events is seeded within each run's waits.

Usage: python -m bench.audit [cases] [cycles per case]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from bench.e2e import end_to_end
from bench.harness import bench_settings
from casetrail.audit.whole_log import audit_namespace
from casetrail.ops.setup import remove

PORT = 8799
ROUND = 1000
"""Cases per seeding round."""
UP_AUDIT_SECONDS = 600.0
"""How often `casetrail up` runs a pass: the scrub's budget is its seconds in this."""


async def audit_cost(cases: int, cycles: int) -> dict[str, Any]:
    settings = bench_settings(api_port=PORT)
    try:
        events, seeded_seconds = 0, 0.0
        for first in range(0, cases, ROUND):
            seeded = await end_to_end(min(ROUND, cases - first), cycles, 1,
                                      settings=settings, keep=True)
            events += seeded["events"]
            seeded_seconds += seeded["seconds"]
        passes: dict[str, dict[str, Any]] = {}
        unbounded = settings.model_copy(update={"audit_scrub_seconds": 1e9})
        for name, full, pass_settings in (("full", True, settings),
                                          ("incremental", False, settings),
                                          ("scrubLap", False, unbounded)):
            began, cpu = time.perf_counter(), time.process_time()
            report = await audit_namespace(pass_settings, full=full)
            passes[name] = {
                "seconds": round(time.perf_counter() - began, 2),
                "auditCpuSeconds": round(time.process_time() - cpu, 2),
                "casesChecked": report.cases_checked, "casesScrubbed": report.cases_scrubbed,
                "scrubLapped": report.scrub_lapped, "clean": report.clean}
    finally:
        await remove(settings)
    per_event = float(passes["full"]["auditCpuSeconds"]) / events
    scrub_per_event = float(passes["scrubLap"]["seconds"]) / events
    budget = settings.audit_scrub_seconds / UP_AUDIT_SECONDS
    return {"cases": cases, "events": events, "seededSeconds": round(seeded_seconds),
            **passes,
            "cpuMicrosecondsPerEvent": round(per_event * 1e6, 1),
            "projectedFullPassCpuSecondsAt25MEvents": round(per_event * 25_000_000),
            "scrubWallMicrosecondsPerEvent": round(scrub_per_event * 1e6, 1),
            "scrubShareOfOneCore": budget,
            "scrubLapDaysAt25MEvents": round(
                scrub_per_event * 25_000_000 / budget / 86400, 2)}


if __name__ == "__main__":
    n, k = (int(a) for a in (sys.argv[1:] + ["2000", "10"][len(sys.argv) - 1:]))
    os.environ.setdefault("CASETRAIL_LOG_LEVEL", "WARNING")
    print(asyncio.run(audit_cost(n, k)))
