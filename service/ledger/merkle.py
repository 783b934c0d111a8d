"""The Merkle tree of the transparency log: RFC 6962 / RFC 9162 hashing, the proofs'
shapes, their checks, and the C2SP ``tlog-tiles`` layout the tree is kept in. No I/O.

- A leaf's hash is ``SHA-256(0x00 || data)``; an interior node's ``SHA-256(0x01 || left ||
  right)``; the root of ``n`` leaves is RFC 9162's ``MTH`` (section 2.1.1). A leaf's data
  here is the 32 raw bytes of a stored event's ``hash``.
- Proofs are lists of ``MTH`` values of leaf ranges (``PATH`` and ``PROOF``, sections
  2.1.3 and 2.1.4). Every such range splits into complete, aligned subtrees
  (:func:`range_subtrees`), and a complete subtree is read from tiles.
- Tiles (c2sp.org/tlog-tiles, height 8): the tile at level ``L`` and index ``N`` holds the
  hashes of the complete subtrees of height ``8L`` numbered ``256N`` ... ``256N + 255``
  (fewer in the rightmost, partial tile). A subtree of height ``8L + r`` is the merge of
  ``2**r`` consecutive entries of one level-``L`` tile.
- :func:`verify_inclusion` and :func:`verify_consistency` are RFC 9162's algorithms
  (sections 2.1.3.2 and 2.1.4.2), which ``verify-bundle`` and the witness run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
"""Hashes in a full tile."""

HASH_SIZE = 32

Subtree = tuple[int, int]
"""``(height, index)``: the complete subtree over leaves ``[index * 2**height,
(index + 1) * 2**height)``."""

Range = tuple[int, int]
"""``(lo, hi)``: leaves ``lo`` ... ``hi - 1``."""


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


EMPTY_ROOT = hashlib.sha256(b"").digest()
"""``MTH({})``: the root of the empty tree."""


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def range_subtrees(lo: int, hi: int) -> list[Subtree]:
    """The complete subtrees, left to right, whose ``MTH`` values fold (from the right)
    into ``MTH(D[lo:hi])``. Every range a proof or a root asks for starts at a multiple
    of its own largest power of two, so each subtree is aligned."""
    out: list[Subtree] = []
    while lo < hi:
        n = hi - lo
        k = n if n & (n - 1) == 0 else _split(n)
        height = k.bit_length() - 1
        if lo % k:
            raise ValueError(f"range [{lo}, {hi}) is not aligned to complete subtrees")
        out.append((height, lo >> height))
        lo += k
    return out


def fold(hashes: Sequence[bytes]) -> bytes:
    """``MTH`` of a range from the hashes of its :func:`range_subtrees`."""
    root = hashes[-1]
    for left in reversed(hashes[:-1]):
        root = node_hash(left, root)
    return root


def merge(entries: Sequence[bytes]) -> bytes:
    """The root of a complete subtree from its ``2**r`` hashes one tile level down."""
    level = list(entries)
    while len(level) > 1:
        level = [node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def inclusion_ranges(index: int, size: int) -> list[Range]:
    """The ranges whose ``MTH`` values are ``PATH(index, D[0:size])``, leaf's sibling
    first (RFC 9162 section 2.1.3.1)."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")
    stack: list[Range] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            stack.append((lo + k, hi))
            hi = lo + k
        else:
            stack.append((lo, lo + k))
            lo += k
    return stack[::-1]


def consistency_ranges(old: int, new: int) -> list[Range]:
    """The ranges whose ``MTH`` values are ``PROOF(old, D[0:new])`` (RFC 9162 section
    2.1.4.1); empty when ``old`` is 0 or equals ``new``."""
    if not 0 <= old <= new:
        raise ValueError(f"no consistency proof from {old} to {new}")
    if old in (0, new):
        return []
    stack: list[Range] = []
    lo, hi, m, whole = 0, new, old, True
    while True:
        n = hi - lo
        if m == n:
            if not whole:
                stack.append((lo, hi))
            break
        k = _split(n)
        if m <= k:
            stack.append((lo + k, hi))
            hi = lo + k
        else:
            stack.append((lo, lo + k))
            m -= k
            lo += k
            whole = False
    return stack[::-1]


# -- tiles ------------------------------------------------------------------------------

Tile = tuple[int, int]
"""``(level, index)`` of a tile."""


def entries_of(subtree: Subtree) -> tuple[int, int, int]:
    """``(level, first, count)``: the tile-level entries a complete subtree merges."""
    height, index = subtree
    level, r = divmod(height, TILE_HEIGHT)
    return level, index << r, 1 << r


def tiles_for(subtrees: Sequence[Subtree]) -> set[Tile]:
    """The tiles holding everything ``subtrees`` need."""
    needed: set[Tile] = set()
    for subtree in subtrees:
        level, first, count = entries_of(subtree)
        needed.add((level, first // TILE_WIDTH))
        needed.add((level, (first + count - 1) // TILE_WIDTH))
    return needed


EntryReader = Callable[[int, int, int], Sequence[bytes]]
"""``read(level, first, count)``: ``count`` consecutive entries of one tile level."""


def subtree_hash(read: EntryReader, subtree: Subtree) -> bytes:
    level, first, count = entries_of(subtree)
    return merge(read(level, first, count))


def range_hash(read: EntryReader, lo: int, hi: int) -> bytes:
    return fold([subtree_hash(read, s) for s in range_subtrees(lo, hi)])


def root(read: EntryReader, size: int) -> bytes:
    return EMPTY_ROOT if size == 0 else range_hash(read, 0, size)


def proof_subtrees(ranges: Sequence[Range]) -> list[Subtree]:
    return [s for lo, hi in ranges for s in range_subtrees(lo, hi)]


def tiles_for_proof(ranges: Sequence[Range]) -> set[Tile]:
    return tiles_for(proof_subtrees(ranges))


def tile_entries(tiles: dict[Tile, bytes]) -> EntryReader:
    """An :data:`EntryReader` over tiles read whole (``{(level, index): hashes}``)."""

    def read(level: int, first: int, count: int) -> list[bytes]:
        out = []
        for entry in range(first, first + count):
            data = tiles.get((level, entry // TILE_WIDTH))
            offset = (entry % TILE_WIDTH) * HASH_SIZE
            if data is None or offset + HASH_SIZE > len(data):
                raise LookupError(f"tile entry {level}/{entry} is not stored")
            out.append(data[offset:offset + HASH_SIZE])
        return out

    return read


class Edge:
    """The right edge of the tree: the partial tile of every level, which is all an
    appender needs (and all the root of the current size needs)."""

    def __init__(self, size: int = 0, partial: dict[int, list[bytes]] | None = None) -> None:
        self.size = size
        self.partial: dict[int, list[bytes]] = partial or {}

    def copy(self) -> Edge:
        """An edge to append to without touching this one (until its batch commits)."""
        return Edge(self.size, {level: list(tile) for level, tile in self.partial.items()})

    @staticmethod
    def widths(size: int) -> dict[int, tuple[int, int]]:
        """``{level: (tile index, width)}`` of the partial tile of each level at
        ``size`` (width 0: the level's last tile is full)."""
        out, level, count = {}, 0, size
        while count:
            out[level] = divmod(count, TILE_WIDTH)
            level += 1
            count >>= TILE_HEIGHT
        return out

    def append(self, leaf_hashes: Sequence[bytes]) -> dict[Tile, bytes]:
        """Append leaves; returns every tile that changed, with its new contents."""
        changed: dict[Tile, bytes] = {}
        touched: set[int] = set()
        partial = self.partial
        for leaf in leaf_hashes:
            level, value, index = 0, leaf, self.size
            self.size += 1
            while True:
                tile = partial.setdefault(level, [])
                tile.append(value)
                touched.add(level)
                if len(tile) < TILE_WIDTH:
                    break
                changed[(level, index // TILE_WIDTH)] = b"".join(tile)  # now full
                value = merge(tile)
                partial[level] = []
                level, index = level + 1, index >> TILE_HEIGHT
        for level in touched:
            if partial[level]:
                stored = self.size >> (TILE_HEIGHT * level)
                changed[(level, stored // TILE_WIDTH)] = b"".join(partial[level])
        return changed

    def read(self, level: int, first: int, count: int) -> list[bytes]:
        """Entries of the partial tiles (those the current root needs)."""
        stored = self.size >> (TILE_HEIGHT * level)
        start = stored - len(self.partial.get(level, []))
        if first < start or first + count > stored:
            raise LookupError(f"entries {level}/{first}+{count} are not on the edge")
        return self.partial[level][first - start:first - start + count]

    def root(self) -> bytes:
        return root(self.read, self.size)


# -- checks (RFC 9162) --------------------------------------------------------------------

def verify_inclusion(leaf: bytes, index: int, size: int, path: Sequence[bytes],
                     root_hash: bytes) -> bool:
    """Does ``path`` prove the leaf hash ``leaf`` at ``index`` in the tree of ``size``
    with root ``root_hash``? (RFC 9162, 2.1.3.2)"""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root_hash


def verify_consistency(old: int, old_root: bytes, new: int, new_root: bytes,
                       path: Sequence[bytes]) -> bool:
    """Does ``path`` prove the tree of ``new`` leaves extends the tree of ``old``?
    (RFC 9162, 2.1.4.2; equal sizes need equal roots and no path)"""
    if not 0 <= old <= new:
        return False
    if old == new:
        return old_root == new_root and not path
    if old == 0:
        return not path
    if not path:
        return False
    proof = list(path)
    if old & (old - 1) == 0:
        proof.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0
