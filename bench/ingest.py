"""Consumer ingest alone, one scenario of ``make bench``, for quick A/B runs:
``python -m bench.ingest [EVENTS] [PROCESSES]``."""

from __future__ import annotations

import asyncio
import sys

from bench.harness import bench_settings
from bench.scenarios import consumer_ingest


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    processes = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    print(asyncio.run(consumer_ingest(bench_settings(), events, consumers=processes)))


if __name__ == "__main__":
    main()
