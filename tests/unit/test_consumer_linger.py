"""The consumer lingers longer for a batch only while it is under load."""

from __future__ import annotations

from typing import Any

from casetrail.config import Settings
from casetrail.consumers.event_log import BUSY_BATCH, EventLogConsumer


def _consumer(**options: Any) -> EventLogConsumer:
    # Only the batching options matter here; nothing is connected.
    nothing: Any = None
    return EventLogConsumer(connection=nothing, writer=nothing, topology=nothing,
                            admission=nothing, **options)


def test_an_idle_consumer_stores_at_once_and_a_busy_one_gathers() -> None:
    consumer = _consumer(linger=0.005, busy_linger=0.025)
    assert consumer.linger_after(0) == 0.005  # stopping, nothing taken
    assert consumer.linger_after(1) == 0.005
    assert consumer.linger_after(BUSY_BATCH - 1) == 0.005
    assert consumer.linger_after(BUSY_BATCH) == 0.025
    assert consumer.linger_after(500) == 0.025


def test_the_defaults_linger_longer_only_under_load() -> None:
    settings = Settings()
    assert settings.consumer_busy_linger_ms > settings.consumer_linger_ms
