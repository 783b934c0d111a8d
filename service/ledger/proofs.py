"""A bundle's log proofs, made and checked: each event's C2SP ``tlog-proof`` (its leaf
index, its RFC 9162 inclusion path and the signed checkpoint) against the log's key and
the witnesses a verifier trusts. No I/O."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from casetrail.ledger import merkle
from casetrail.ledger.note import (
    Checkpoint,
    Note,
    NoteError,
    TlogProof,
    Verifier,
    open_with_any,
)
from casetrail.trail.verification import Problem


@dataclass
class LogCheck:
    """What the log proofs of a bundle showed."""

    problems: list[Problem] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    trusted: bool = False
    """The checkpoint is signed by a trusted log key."""
    witnesses: list[str] = field(default_factory=list)
    logged: int = 0
    included: set[tuple[int, int]] = field(default_factory=set)
    """``(attempt, seq)`` of the events whose proof leads to the checkpoint's root."""
    cosigned_at: list[int] = field(default_factory=list)
    """When each trusted witness cosigned the checkpoint (POSIX seconds, its own word)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "checkpoint": None if self.checkpoint is None else {
                "origin": self.checkpoint.origin, "treeSize": self.checkpoint.size,
                "rootHash": base64.b64encode(self.checkpoint.root).decode()},
            "checkpointTrusted": self.trusted, "witnesses": self.witnesses,
            "eventsInLog": self.logged,
        }


@dataclass(frozen=True)
class LoggedEvent:
    attempt: int
    seq: int
    hash: str | None
    """The event's chain hash (64 hex), the leaf's data."""
    proof: str | None


def _included(event: LoggedEvent, checkpoint_note: str, head: Checkpoint,
              indexes: dict[int, LoggedEvent], required: bool) -> int | tuple[str, str] | None:
    """The leaf index ``event``'s proof includes it at under ``head``, or the problem's code
    and message; ``None`` for an event without a proof that need not have one."""
    if event.proof is None:
        return ("not_in_log", "the event carries no inclusion proof") if required else None
    try:
        proof = TlogProof.parse(event.proof)
    except NoteError as exc:
        return "bad_log_proof", str(exc)
    if proof.checkpoint != checkpoint_note:
        return "bad_log_proof", "the proof is for another checkpoint"
    if event.hash is None or proof.index in indexes:
        return "bad_log_proof", "the proof names no event hash or a leaf twice"
    leaf = merkle.leaf_hash(bytes.fromhex(event.hash))
    if not merkle.verify_inclusion(leaf, proof.index, head.size, proof.path, head.root):
        return "bad_log_proof", (f"leaf {proof.index} is not included in the tree of "
                                 f"{head.size} under the checkpoint's root")
    return proof.index


def check_log(checkpoint_note: str | None, events: Sequence[LoggedEvent],
              log_keys: Sequence[Verifier], witnesses: Sequence[Verifier]) -> LogCheck:
    """Every proof's path must lead from the event's leaf to the checkpoint's root. With
    ``log_keys``, the checkpoint must carry a valid signature of one and every event a
    proof; with ``witnesses``, a valid cosignature of each."""
    check = LogCheck()

    def problem(event: LoggedEvent | None, code: str, message: str) -> None:
        check.problems.append(Problem(event.attempt if event else None,
                                      event.seq if event else None, code, message))

    if checkpoint_note is None:
        if log_keys:
            problem(None, "not_in_log", "the bundle carries no checkpoint of the log")
        return check
    try:
        if log_keys:
            check.checkpoint, note = open_with_any(checkpoint_note, log_keys)
            check.trusted = True
        else:
            note = Note.parse(checkpoint_note)
            check.checkpoint = Checkpoint.parse(note.text)
    except NoteError as exc:
        problem(None, "bad_checkpoint", str(exc))
        return check
    for witness in witnesses:
        if (cosigned := note.signed_by(witness)) is not None:
            check.witnesses.append(witness.name)
            if cosigned.timestamp is not None:
                check.cosigned_at.append(cosigned.timestamp)
        else:
            problem(None, "missing_cosignature",
                    f"the checkpoint carries no valid cosignature of {witness.name}")
    indexes: dict[int, LoggedEvent] = {}
    for event in events:
        found = _included(event, checkpoint_note, check.checkpoint, indexes, bool(log_keys))
        if isinstance(found, tuple):
            problem(event, *found)
        elif found is not None:
            indexes[found] = event
            check.included.add((event.attempt, event.seq))
            check.logged += 1
    return check

