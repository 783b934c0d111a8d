"""Whether the log still vouches for what it serves (docs/design.md, "The log says when it
has stopped vouching").

The ledger halts when its stored tree does not hold the largest checkpoint it ever
signed (casetrail.ledger.high_water): a database restored from an older backup. But the
API serves checkpoints and proofs from that same database, so without a check of its
own it would go on serving the restored, smaller checkpoint as the log's latest. So the
API learns of the halt by itself, not from a live ledger: it follows the log-head stream
(``<ns>.log-head``, where every checkpoint the log signed is published), keeps the
largest checkpoint on it that the log's key signed, and compares the database's latest
with it. While the database's is smaller (``behind``) or holds another root at that
size (``forked``), the log's routes answer 503 naming the halt and both sizes, and
``/readyz`` says so in its ``log`` field.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from casetrail.ledger.high_water import Anchor, LogHalted, check_tree
from casetrail.ledger.note import Checkpoint


@dataclass(frozen=True)
class LogState:
    """The log as the API serves it: halted (and why), the database's latest checkpoint
    size and the largest one the log is known to have signed."""

    halted: bool
    reason: str | None
    stored_size: int | None
    anchor_size: int | None
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"halted": self.halted, "reason": self.reason, "storedSize": self.stored_size,
                "anchorSize": self.anchor_size}


async def log_state(stored: tuple[int, bytes] | None, anchor: Checkpoint | None, note: str,
                    root_at: Callable[[int], Awaitable[bytes]]) -> LogState:
    """The log's state: ``stored``, the size and root of the database's latest
    checkpoint, against ``anchor``, the largest the log is known to have signed
    (``note``: its text); ``root_at`` reads the stored tree's root at a size."""
    size = stored[0] if stored is not None else 0
    if anchor is None:
        return LogState(False, None, stored[0] if stored else None, None)

    async def root(at: int) -> bytes:
        return stored[1] if stored is not None and at == stored[0] else await root_at(at)

    try:
        await check_tree([Anchor(anchor, note, "the log-head stream")], size, root)
    except LogHalted as halted:
        return LogState(True, halted.reason.value, size, anchor.size, (
            f"the log has stopped vouching ({halted.reason.value}): its database's latest "
            f"checkpoint has {size} leaves, but the log signed {anchor.describe()} "
            f"(on the log-head stream); nothing it holds now is served as the log's "
            f"until an operator mends it (docs/operations.md, \"The log is behind\")"))
    return LogState(False, None, size, anchor.size)
