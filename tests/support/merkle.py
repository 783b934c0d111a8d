"""RFC 9162's Merkle tree hash, written from the RFC: what the log is checked against."""

from __future__ import annotations

import hashlib

from casetrail.ledger import merkle


def mth(leaves: list[bytes]) -> bytes:
    """RFC 9162's MTH, written from its definition (section 2.1.1)."""
    if not leaves:
        return merkle.EMPTY_ROOT
    if len(leaves) == 1:
        return merkle.leaf_hash(leaves[0])
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return merkle.node_hash(mth(leaves[:k]), mth(leaves[k:]))


def data(n: int) -> list[bytes]:
    return [hashlib.sha256(f"event {i}".encode()).digest() for i in range(n)]


def grown(leaves: list[bytes]) -> tuple[merkle.Edge, dict[merkle.Tile, bytes]]:
    """The tree grown in uneven batches, as the ledger grows it; its tiles."""
    edge, tiles, at, step = merkle.Edge(), {}, 0, 1
    while at < len(leaves):
        tiles.update(edge.append([merkle.leaf_hash(d) for d in leaves[at:at + step]]))
        at, step = at + step, step * 3 % 517 + 1
    return edge, tiles
