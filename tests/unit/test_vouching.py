"""Whether the log vouches for what it serves (casetrail.ledger.vouching): the largest
checkpoint the log's key signed, kept whatever floods the stream, against the database's
latest."""

from __future__ import annotations

import hashlib

from casetrail.ledger.high_water import HighestSigned, from_stream, size_of
from casetrail.ledger.note import Checkpoint, NoteSigner, sign
from casetrail.ledger.vouching import log_state

LOG = NoteSigner.generate("casetrail.example/log")
OTHER = NoteSigner.generate("casetrail.example/log")


def root(size: int) -> bytes:
    return hashlib.sha256(f"root {size}".encode()).digest()


def note(size: int, signer: NoteSigner = LOG) -> bytes:
    return sign(Checkpoint(signer.name, size, root(size)).text(), signer).render().encode()


def test_a_flood_of_old_checkpoints_and_forgeries_changes_nothing() -> None:
    highest = HighestSigned()
    assert highest.offer(note(90), [LOG.verifier]) is True
    for body in [note(36)] * 1000 + [b"junk", b"x\n99999999999999999999\n", note(500, OTHER)]:
        assert highest.offer(body, [LOG.verifier]) in (False, None)
    assert highest.best is not None and highest.best.size == 90
    # A larger one no known key signed is "not yet": the watch may read the keys again.
    assert highest.offer(note(500, OTHER), [LOG.verifier]) is None
    assert highest.offer(note(500, OTHER), [LOG.verifier, OTHER.verifier]) is True


def test_a_whole_stream_gives_its_largest_wherever_it_is() -> None:
    anchor = from_stream([note(5), note(90), *[note(36)] * 50], LOG.verifier, "stream")
    assert anchor is not None and anchor.head.size == 90
    assert from_stream([b"", note(7, OTHER)], LOG.verifier, "stream") is None
    assert size_of(b"origin\n42\nrest") == 42 and size_of(b"origin\n-1\nrest") is None


async def test_the_log_is_halted_while_its_database_is_behind_or_forked() -> None:
    anchor = Checkpoint(LOG.name, 90, root(90))

    async def root_at(size: int) -> bytes:
        return root(size)

    behind = await log_state((36, root(36)), anchor, "", root_at)
    assert (behind.halted, behind.reason, behind.stored_size, behind.anchor_size) == \
        (True, "behind", 36, 90)
    assert "36 leaves" in behind.detail and "size 90" in behind.detail
    forked = await log_state((90, root(91)), anchor, "", root_at)
    assert (forked.halted, forked.reason) == (True, "forked")
    ahead = await log_state((120, root(120)), anchor, "", root_at)
    assert not ahead.halted and ahead.as_json() == {
        "halted": False, "reason": None, "storedSize": 120, "anchorSize": 90}
    unknown = await log_state(None, None, "", root_at)
    assert not unknown.halted and unknown.anchor_size is None
    empty = await log_state(None, anchor, "", root_at)
    assert (empty.halted, empty.reason, empty.stored_size) == (True, "behind", 0)
