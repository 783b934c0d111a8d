"""A component's Prometheus metrics, scraped and summed."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = list[tuple[str, dict[str, str], float]]


async def scrape(port: int) -> Samples:
    async with httpx.AsyncClient() as client:
        reply = await client.get(f"http://127.0.0.1:{port}/metrics")
    assert reply.status_code == 200
    return [(s.name, s.labels, s.value)
            for family in text_string_to_metric_families(reply.text) for s in family.samples]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(value for found, have, value in samples
               if found == name and labels.items() <= have.items())
