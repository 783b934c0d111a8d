"""Delays between retries, from tenacity's wait strategies, for the loops that retry
by hand: the engine's model requests, the worker-tool RPC, the publisher and the
event-log consumer."""

from __future__ import annotations

from tenacity import RetryCallState, wait_exponential_jitter


def backoff_delay(strategy: wait_exponential_jitter, attempt: int) -> float:
    """The tenacity strategy's delay before retry number ``attempt``."""
    retry_state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    retry_state.attempt_number = attempt
    return float(strategy(retry_state))
