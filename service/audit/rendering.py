"""Rendering a trail for a person: cycle by cycle, reasoning, tool calls with
arguments, results, source and duration, tokens."""

from __future__ import annotations

import textwrap
from typing import Any

import orjson

from casetrail.engine.tools import without_bytes

AUDITOR_SQL = (
    "SELECT event_id, attempt, seq, event_type, occurred_at, payload\n"
    "FROM event_log\n"
    "WHERE case_id = $1 AND event_type = ANY($2)\n"
    "ORDER BY attempt, seq;"
)


def _json(value: Any, limit: int = 160) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(
        textwrap.fill(line, width=100, initial_indent=prefix, subsequent_indent=prefix)
        for line in text.splitlines() if line.strip()
    )


def answered_by(call: dict[str, Any]) -> str | None:
    """Who answered a recorded tool call beyond its source, as every display names it:
    an MCP server's tool (and the schema it was offered under), or a remote A2A agent's
    skill, the card it served and the task that answered; ``None`` for any other."""
    if isinstance(mcp := call.get("mcp"), dict):
        return (f"MCP server {mcp.get('server')}, tool {mcp.get('tool')}, schema "
                f"{str(mcp.get('schemaDigest') or '?')[:16]}")
    if isinstance(a2a := call.get("a2a"), dict):
        parts = [f"A2A agent {a2a.get('agent')}"]
        if a2a.get("skill"):
            parts.append(f"skill {a2a['skill']}")
        if a2a.get("cardDigest"):
            parts.append(f"card {str(a2a['cardDigest'])[:16]}")
        if a2a.get("taskId"):
            parts.append(f"task {a2a['taskId']}"
                         + (f" ({a2a['state']})" if a2a.get("state") else ""))
        return ", ".join(parts)
    return None


def format_event(event: dict[str, Any]) -> str:
    """One event (envelope form, camelCase) as a few readable lines."""
    kind, payload = event["eventType"], event["payload"]
    head = f"  [attempt {event['attempt']} · seq {event['seq']}] {kind}"
    if kind == "CASE_STARTED":
        tools = ", ".join(f"{t['name']} ({t['source']})" for t in payload["toolsOffered"])
        limits = payload["limits"]
        lines = [f"{head}  agent={payload['agent']} model={payload['model']['name']}",
                 f"      limits: {limits['maxCycles']} cycles, {limits['deadlineSeconds']}s; "
                 f"tools: {tools}"]
        if payload.get("restartReason"):
            lines.append(f"      restarted: {payload['restartReason']}")
        return "\n".join(lines)
    if kind == "REACT_CYCLE":
        usage = payload["tokenUsage"]
        # Cycles are counted from 1 in every display (the record's cycleIndex from 0).
        lines = [f"{head} cycle {payload['cycleIndex'] + 1}  tokens in={usage['inputTokens']} "
                 f"out={usage['outputTokens']}", _indent(payload["reasoningText"])]
        for call in payload["toolCalls"]:
            outcome = (f"ERROR {call['error']}" if "error" in call
                       else f"→ {_json(without_bytes(call.get('toolResult')))}")
            by = answered_by(call)
            lines.append(f"      ⚙ {call['toolName']}({_json(call['toolArgs'], 120)}) "
                         f"[{call['toolSource']}" + (f"; {by}" if by else "")
                         + f", {call['durationMs']} ms]")
            lines.append(f"        {outcome}")
            for attempt in call.get("attempts", []):
                if attempt["outcome"] != "ok" or len(call["attempts"]) > 1:
                    lines.append(f"        attempt {attempt['attempt']}: {attempt['outcome']} "
                                 f"{attempt.get('error') or ''}".rstrip())
        for retry in payload.get("modelRetries", []):
            lines.append(f"      ↻ model retry after {retry['waitedMs']} ms: {retry['reason']}")
        return "\n".join(lines)
    if kind == "CASE_REVIEWED":
        reviewer = payload.get("reviewer") or {}
        via = f"key {reviewer.get('keyId')}" if reviewer.get("via") == "key" else "oidc"
        decided = payload.get("decision")
        lines = [f"{head}  {payload.get('verdict')} by {reviewer.get('subject')} (via {via})",
                 _indent(f"reason: {payload.get('reason')}")]
        if decided is not None:
            lines.append(_indent("decision: " + _json(decided, 400)))
        return "\n".join(lines)
    totals = payload.get("tokenTotals", {})
    summary = (f"{payload.get('cyclesCompleted', 0)} cycles, tokens in="
               f"{totals.get('inputTokens', 0)} out={totals.get('outputTokens', 0)}")
    if kind == "CASE_COMPLETED":
        by = f" (decided by the {payload['decidedBy']})" if payload.get("decidedBy") else ""
        detail = "answer" + by + ": " + _json(payload.get("answer"), 400)
    elif kind == "CASE_AWAITING_REVIEW":
        failed = [c["name"] for c in payload.get("checks") or () if not c.get("passed")]
        detail = (f"a person decides ({', '.join(payload.get('reviewReasons') or ())}"
                  + (f"; failed checks: {', '.join(failed)}" if failed else "") + "): "
                  + _json(payload.get("answer"), 400))
    elif kind == "CASE_FAILED":
        detail = f"{payload.get('reasonCode')}: {payload.get('message')}"
    elif kind == "CASE_CANCELLED":
        queued = " (while queued)" if payload.get("whileQueued") else ""
        detail = f"reason: {payload.get('reason')}{queued}"
    else:
        detail = str(payload.get("message", ""))
    return f"{head}  {summary}\n{_indent(detail)}"


def format_trail(case_id: str, events: list[dict[str, Any]]) -> str:
    lines = [f"Trail of case {case_id} ({len(events)} events)"]
    lines += [format_event(e) for e in events]
    return "\n".join(lines)
