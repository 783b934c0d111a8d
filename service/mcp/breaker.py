"""A circuit breaker per MCP server, kept by its capability worker (docs/design.md, "MCP
tools"): *closed* while a session is open; *open* once the session keeper has failed to
open one ``OPENS_AFTER`` times in a row (the server is down: a call fails at once, never
after its timeout and every retry); *half-open* while the keeper tries again, its
attempt the only traffic the server gets. The state is the metric
``casetrail_mcp_circuit_state`` (0 closed, 1 half-open, 2 open)."""

from __future__ import annotations

from typing import Literal

from casetrail.telemetry import metrics

OPENS_AFTER = 2
"""Failed attempts in a row to open a session that open the circuit."""

State = Literal["closed", "half_open", "open"]
_GAUGE: dict[State, int] = {"closed": 0, "half_open": 1, "open": 2}


class Breaker:
    """The circuit of one server."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.failures = 0
        self.state: State = "closed"
        self._set("closed")

    def _set(self, state: State) -> None:
        self.state = state
        metrics.MCP_CIRCUIT_STATE.labels(self.server).set(_GAUGE[state])

    @property
    def fails_fast(self) -> bool:
        """Calls fail at once: the server is down, or only being tried again."""
        return self.state != "closed"

    def session_opened(self) -> None:
        self.failures = 0
        self._set("closed")

    def session_failed(self) -> None:
        self.failures += 1
        if self.failures >= OPENS_AFTER:
            self._set("open")

    def trying_again(self) -> None:
        if self.state == "open":
            self._set("half_open")
