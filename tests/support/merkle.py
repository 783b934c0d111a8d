"""RFC 9162's Merkle tree hash, written from the RFC: what the log is checked against."""

from __future__ import annotations

from casetrail.ledger import merkle


def mth(leaves: list[bytes]) -> bytes:
    """RFC 9162's MTH, written from its definition (section 2.1.1)."""
    if not leaves:
        return merkle.EMPTY_ROOT
    if len(leaves) == 1:
        return merkle.leaf_hash(leaves[0])
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return merkle.node_hash(mth(leaves[:k]), mth(leaves[k:]))
