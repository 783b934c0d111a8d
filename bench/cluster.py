"""Scale-out, measured: the end-to-end pipeline with its bus on a three-node RabbitMQ
cluster on this machine (faults/cluster.py), with 1 and 2 workers and 1 and 2 consumers,
beside the same on the single node. On two cores the cluster's three Erlang VMs and
the extra processes share the same CPUs, so this shows what replication costs here,
not what more machines would give (docs/deployment.md says which parts scale out).

Usage: python -m bench.cluster [cases]
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from bench.e2e import end_to_end
from bench.harness import bench_settings
from faults import cluster

SHAPES = ((1, 1), (2, 2))
"""(workers, consumers)."""


async def scale_out(cases: int, cycles: int = 10) -> list[dict[str, Any]]:
    rows = []
    for workers, consumers in SHAPES:
        single = await end_to_end(cases, cycles, workers, consumers=consumers,
                                  settings=bench_settings(api_port=8790))
        rows.append({"bus": "single node", **single})
    await asyncio.to_thread(cluster.start)
    try:
        for workers, consumers in SHAPES:
            on_cluster = await end_to_end(
                cases, cycles, workers, consumers=consumers,
                settings=bench_settings(api_port=8790, amqp_url=cluster.urls(),
                                        rabbitmq_node=cluster.nodes()[0].name))
            rows.append({"bus": "3-node cluster", **on_cluster})
    finally:
        await asyncio.to_thread(cluster.stop)
    return rows


if __name__ == "__main__":
    for row in asyncio.run(scale_out(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)):
        print(f"{row['bus']:<15} workers {row['workers']} consumers {row['consumers']}: "
              f"{row['cyclesPerSecond']:,.0f} cycles/s  cpu {row['cpuSeconds']}")
