"""The log's high-water mark: the largest checkpoint it ever signed, kept where a restore
of its database cannot reach it (docs/design.md, "The log knows how far it has been").

A database restored from an older backup holds an older tree and, with it, an older
"last checkpoint": a ledger that trusted its database would sign a second checkpoint of
some size with another root, a fork. So the ledger keeps two anchors outside Postgres:

- a **state file** beside its key (``<log key>.<namespace>.state.json``, or
  ``CASETRAIL_LEDGER_STATE_FILE``), written and synced before a checkpoint is stored;
- the **log-head stream** ``<ns>.log-head`` on the bus, which keeps the latest published
  checkpoints with no maximum age.

Each anchor is a checkpoint the log's key signed. At start, and before every append,
the stored tree must hold each anchor: as large, with the anchor's root at its size.
Otherwise the ledger halts (``LogHalted``) and names both sizes; it never signs over it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from casetrail.errors import PermanentError
from casetrail.ledger.note import (
    Checkpoint,
    NoteError,
    Verifier,
    open_checkpoint,
    open_with_any,
)
from casetrail.trail.key_source import is_file


class HaltReason(StrEnum):
    """Why the ledger will not sign (the ``reason`` label of ``casetrail_ledger_halted``)."""

    BEHIND = "behind"
    """The stored tree is smaller than a checkpoint the log signed: a restore rolled it
    back."""
    FORKED = "forked"
    """The stored tree's root at an anchor's size is not the anchor's."""
    NO_ANCHOR = "no_anchor"
    """The log has signed before but neither anchor can be read."""


class LogHalted(Exception):
    """The ledger must not append or sign: ``reason`` and a message naming both sizes."""

    def __init__(self, reason: HaltReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Anchor:
    """A checkpoint the log signed, and where it was kept."""

    head: Checkpoint
    note: str
    source: str

    def describe(self) -> str:
        return f"{self.head.describe()} (from {self.source})"


def state_file_for(log_key_file: str, namespace: str, configured: str | None,
                   setting: str = "CASETRAIL_LEDGER_STATE_FILE",
                   what: str = "the ledger keeps its high-water mark") -> Path:
    """A component's state file kept off the database (the ledger's, by default):
    ``configured``, else beside its key's file, named for the namespace
    (``<key>.<namespace>.state.json``). A key from the environment or a provider has no
    file to stand beside: then the setting is required."""
    if configured:
        return Path(configured)
    if not is_file(log_key_file):
        raise PermanentError(f"the key comes from {log_key_file!r}: set {setting}, where "
                             f"{what}")
    return Path(f"{log_key_file}.{namespace}.state.json")


@dataclass(frozen=True)
class StateFile:
    """The high-water checkpoint on local disk, replaced atomically and synced."""

    path: Path

    def read(self, verifier: Verifier) -> Anchor | None:
        """The checkpoint kept here; ``None`` when there is no file. A file that is there
        but unreadable, or not signed by the log's key, is an error: never "no anchor"."""
        try:
            state = json.loads(self.path.read_text())
            note = state["checkpoint"]
            head, _ = open_checkpoint(note, verifier)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, NoteError) as exc:
            raise LogHalted(HaltReason.NO_ANCHOR, f"the ledger's state file {self.path} "
                            f"cannot be read as a checkpoint of this log: {exc}") from None
        return Anchor(head, note, f"state file {self.path}")

    def write(self, note: str, *, reason: str | None = None) -> None:
        """Keep ``note`` (a signed checkpoint) as the high-water mark, durably."""
        record: dict[str, str] = {"checkpoint": note}
        if reason:
            record["acceptedBecause"] = reason
        write_json_durably(self.path, record, ".ledger-")


def write_json_durably(path: Path, value: object, prefix: str) -> None:
    """Replace ``path`` with ``value`` as JSON (mode 0600), atomically and synced, with
    its directory: the ledger's and a witness's memory of the log."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=prefix)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(value, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def size_of(body: bytes) -> int | None:
    """A checkpoint note's tree size (its second line), read without verifying it:
    ``None`` for anything that is not shaped like a checkpoint."""
    lines = body.split(b"\n", 2)
    if len(lines) < 3 or not lines[1].isdigit() or len(lines[1]) > 19:
        return None
    return int(lines[1])


@dataclass
class HighestSigned:
    """The largest checkpoint among those offered that one of the log's keys signed.
    A note no larger than the one kept is passed over unverified, so a flood of old
    genuine checkpoints costs a parse each and changes nothing."""

    best: Checkpoint | None = None
    note: str = ""

    def offer(self, body: bytes, keys: Sequence[Verifier]) -> bool | None:
        """``True`` when ``body`` is the new largest; ``False`` when it is no larger or
        not a checkpoint; ``None`` when it is larger but no key in ``keys`` signed it
        (the caller may read the log's keys again and offer it once more)."""
        size = size_of(body)
        if size is None or (self.best is not None and size <= self.best.size):
            return False
        try:
            text = body.decode()
            head, _ = open_with_any(text, keys)
        except (UnicodeDecodeError, NoteError):
            return None
        self.best, self.note = head, text
        return True


def from_stream(notes: Iterable[bytes], verifier: Verifier, source: str) -> Anchor | None:
    """The largest checkpoint among ``notes`` (a whole stream, read from its first) that
    the log's key signed; anything else on the stream is ignored, and a flood of old
    genuine checkpoints changes nothing."""
    highest = HighestSigned()
    for body in notes:
        highest.offer(body, [verifier])
    return None if highest.best is None else Anchor(highest.best, highest.note, source)


async def check_tree(anchors: Iterable[Anchor], size: int,
                     root_at: Callable[[int], Awaitable[bytes]]) -> None:
    """``LogHalted`` unless the stored tree of ``size`` leaves holds every anchor."""
    for anchor in anchors:
        if anchor.head.size > size:
            raise LogHalted(HaltReason.BEHIND, (
                f"the stored tree has {size} leaves but the log signed "
                f"{anchor.describe()}: its database was rolled back (a restore?). It will "
                "not sign over it; see docs/operations.md, \"The log is behind\""))
        if anchor.head.size and await root_at(anchor.head.size) != anchor.head.root:
            raise LogHalted(HaltReason.FORKED, (
                f"the stored tree's root at {anchor.head.size} leaves is not the one of "
                f"{anchor.describe()}: the tree differs from what the log signed"))

