"""The registry of agent profiles, and the capabilities their WorkerTools need."""

from __future__ import annotations

from typing import Any

from service.agents.aml_screening import AML_SCREENING
from service.agents.loan_officer import LOAN_OFFICER
from service.agents.profile import AgentProfile
from service.agents.throughput_probe import THROUGHPUT_PROBE
from service.engine.tools import Capability

AGENTS: dict[str, AgentProfile] = {
    agent.name: agent for agent in (LOAN_OFFICER, AML_SCREENING, THROUGHPUT_PROBE)
}

CAPABILITIES: dict[str, Capability[Any]] = {
    capability.name: capability for agent in AGENTS.values() for capability in agent.capabilities
}

__all__ = ["AGENTS", "CAPABILITIES", "AgentProfile"]
