"""The public authoring API is pinned (docs/compatibility.md): the names ``casetrail``
exports, each one loadable, and the signature of ``casetrail.testing.run_case``. A
change here is a change of the public surface: the changelog and the version say so."""

from __future__ import annotations

import inspect

import casetrail
import casetrail.testing

PUBLIC = [
    "A2aTool", "Agent", "AssistantTurn", "CASETRAIL_VERSION", "ChatMessage", "ChatModel",
    "Check", "CheckContext", "DeclarationError", "FINAL_ANSWER", "Limits", "LocalTool",
    "McpTool", "ModelRef", "ProviderSpec", "Review", "Sensitive", "ToolCallRequest",
    "WorkerTool", "call", "capability", "case_input", "observed",
]

RUN_CASE = (
    "(agent: 'Agent | AgentProfile', case_input: 'dict[str, Any]', *, "
    "model: 'ChatModel | ModelRef | None' = None, "
    "mcp_servers: 'Sequence[Mapping[str, Any]]' = (), "
    "endpoints: 'Sequence[Mapping[str, Any]] | None' = None, "
    "a2a_agents: 'Sequence[Mapping[str, Any]]' = ()) -> 'CaseRun'"
)


def test_the_package_exports_exactly_the_public_names() -> None:
    assert sorted(casetrail.__all__) == sorted(PUBLIC)


def test_every_public_name_loads() -> None:
    loaded = {name: getattr(casetrail, name) for name in PUBLIC}
    assert all(value is not None for value in loaded.values())
    assert isinstance(loaded["CASETRAIL_VERSION"], str)


def test_run_case_keeps_its_signature() -> None:
    assert str(inspect.signature(casetrail.testing.run_case)) == RUN_CASE
