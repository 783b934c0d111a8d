"""A case as an A2A task (docs/a2a.md, "States and artifacts"): its state from the
case's status, a status message saying what it is doing or waiting for (never a
sensitive value: counts, reasons and codes only), and, once completed, its artifacts."""

from __future__ import annotations

from typing import Any

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value
from google.protobuf.timestamp_pb2 import Timestamp

STATES: dict[str, TaskState] = {
    "queued": TaskState.TASK_STATE_SUBMITTED,
    "running": TaskState.TASK_STATE_WORKING,
    "awaiting_review": TaskState.TASK_STATE_WORKING,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "timed_out": TaskState.TASK_STATE_FAILED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
}
ENDED = (TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
         TaskState.TASK_STATE_CANCELED)
"""The states a task does not leave."""
WAITS = {
    "decision": "a reviewer's decision (the agent sends its decisions to review)",
    "failed_check": "a reviewer: a blocking check failed",
    "tenant_policy": "a reviewer (the tenant reviews every case)",
    "question": "a person's answer to the model's question (never the caller's)",
    "second_review": "a second reviewer (four eyes)",
}


def _value(data: Any) -> Value:
    return ParseDict(data, Value())


def _status_text(view: dict[str, Any]) -> str:
    status, outcome = view["status"], view.get("outcome") or {}
    cycles = view.get("cycles", 0)
    if status == "queued":
        return "queued: waiting for a worker"
    if status == "running":
        return f"running: {cycles} cycles recorded so far"
    if status == "awaiting_review":
        reason = outcome.get("reason") or "decision"
        return f"waiting for {WAITS.get(reason, 'a person')}; {cycles} cycles recorded"
    if status == "completed":
        return (f"completed in {cycles} cycles; decided by the "
                f"{outcome.get('decidedBy', 'agent')}")
    if status in ("failed", "timed_out"):
        code = outcome.get("reasonCode", status)
        return f"{status}: {code}: {outcome.get('message', '')}".rstrip(": ")
    return f"cancelled: {outcome.get('reason') or 'on request'}"


def _stamp(text: str | None) -> Timestamp | None:
    if not text:
        return None
    stamp = Timestamp()
    stamp.FromJsonString(text.replace("+00:00", "Z"))
    return stamp


def task_of(view: dict[str, Any], base_url: str) -> Task:
    """The task of a case: ``view`` is ``GET /cases/{id}``'s answer or a list item."""
    case_id, status = view["caseId"], view["status"]
    metadata: dict[str, Any] = {"casetrail": {"status": status, "agent": view["agent"],
                                              "caseId": case_id}}
    outcome = view.get("outcome") or {}
    if status in ("failed", "timed_out"):
        metadata["casetrail"]["reasonCode"] = outcome.get("reasonCode", status)
    message = Message(message_id=f"{case_id}:{status}:{view.get('cycles', 0)}",
                      role=Role.ROLE_AGENT, context_id=case_id, task_id=case_id,
                      parts=[Part(text=_status_text(view))])
    task = Task(id=case_id, context_id=case_id,
                status=TaskStatus(state=STATES[status], message=message))
    stamp = _stamp(view.get("endedAt") or view.get("startedAt") or view.get("createdAt"))
    if stamp is not None:
        task.status.timestamp.CopyFrom(stamp)
    task.metadata.update(metadata)
    if status == "completed" and "answer" in view:
        task.artifacts.extend(_artifacts(view, base_url))
    return task


def _artifacts(view: dict[str, Any], base_url: str) -> list[Artifact]:
    case_id, outcome = view["caseId"], view.get("outcome") or {}
    base = base_url.rstrip("/")
    return [
        Artifact(artifact_id="answer", name="answer", description="The typed answer.",
                 parts=[Part(data=_value(view["answer"]), media_type="application/json")]),
        Artifact(artifact_id="decision", name="decision", description=(
            "Who decided (the agent, or a reviewer) and the agent's checks on the answer."),
                 parts=[Part(data=_value({"decidedBy": outcome.get("decidedBy", "agent"),
                                          "checks": outcome.get("checks", [])}),
                             media_type="application/json")]),
        Artifact(artifact_id="integrity", name="integrity", description=(
            "Whether the case's trail verifies (signatures, chain, completeness)."),
                 parts=[Part(data=_value(view.get("integrity") or {}),
                             media_type="application/json")]),
        Artifact(artifact_id="evidence", name="evidence", description=(
            "The evidence: the offline bundle (`casetrail verify-bundle`) and the PDF "
            "report, fetched with the same credentials."),
                 parts=[Part(url=f"{base}/cases/{case_id}/bundle", filename=(
                     f"casetrail-{case_id}.json"), media_type="application/json"),
                        Part(url=f"{base}/cases/{case_id}/report", filename=(
                            f"casetrail-{case_id}.pdf"), media_type="application/pdf")]),
    ]
