"""Rendering a trail for a person (casetrail.audit.rendering): what each display says
about who answered a tool call."""

from __future__ import annotations

from casetrail.audit.rendering import answered_by, format_event


def test_every_display_names_who_answered_an_mcp_or_an_a2a_call() -> None:
    """The trail and the PDF name an A2A call's agent, skill, card and task as they name
    an MCP call's server and tool (one rule, ``answered_by``)."""
    mcp = {"toolName": "policies_coverage", "toolArgs": {}, "toolSource": "worker",
           "durationMs": 3, "toolResult": {}, "mcp": {
               "server": "policies", "tool": "coverage", "schemaDigest": "ab" * 32}}
    a2a = {"toolName": "kyc_sanctions", "toolArgs": {}, "toolSource": "worker",
           "durationMs": 5, "toolResult": [], "a2a": {
               "agent": "kyc", "skill": "sanctions", "cardDigest": "cd" * 32,
               "taskId": "t-1", "state": "TASK_STATE_COMPLETED"}}
    assert answered_by(mcp) == f"MCP server policies, tool coverage, schema {'ab' * 8}"
    assert answered_by(a2a) == (f"A2A agent kyc, skill sanctions, card {'cd' * 8}, task t-1 "
                                "(TASK_STATE_COMPLETED)")
    assert answered_by({"toolName": "x", "toolSource": "local"}) is None
    cycle = {"eventType": "REACT_CYCLE", "attempt": 1, "seq": 1, "payload": {
        "cycleIndex": 0, "tokenUsage": {"inputTokens": 1, "outputTokens": 1},
        "reasoningText": "asking", "toolCalls": [a2a]}}
    shown = format_event(cycle)
    assert "[worker; A2A agent kyc, skill sanctions" in shown
    assert "REACT_CYCLE cycle 1 " in shown  # counted from 1, as the viewer and PDF count
