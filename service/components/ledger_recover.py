"""``casetrail ledger recover --bundles DIR``: mend a log whose database was restored from
an older backup, when the lost leaves can be had again (docs/operations.md, "The log is
behind").

A ledger halted ``behind`` holds a stored tree of N leaves under a high-water mark of
M > N. An RFC 6962 tree cannot hold a gap: the leaves N … M-1 come back complete and in
order, or not at all. Bundles exported before the restore carry, for each logged event,
its leaf index (in its ``tlog-proof``), its signed bytes and its chain hash. Recovery
takes every bundle in a directory, keeps an event only when its bytes hash to the chain
hash it names (so its event id and case id are bound to the leaf), and needs every index
of the lost range. Then it appends them to a copy of the stored tree and compares the
root at M with the mark's: only the very same log is appended, in one transaction, and
the ledger goes on from M. Otherwise nothing is written and the missing indexes are
named. The events themselves stay lost from ``event_log``: ``casetrail audit`` reports
their cases as ``removed_after_logging``, which is what happened to them.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from casetrail.adapters.store.tree import appending, read_edge, write_leaves
from casetrail.components.ledger_operator import stopped_ledger
from casetrail.config import Settings
from casetrail.contract.integrity import chain_hash
from casetrail.errors import PermanentError
from casetrail.ledger import merkle
from casetrail.ledger.high_water import Anchor
from casetrail.ledger.note import NoteError, TlogProof


@dataclass(frozen=True)
class LostLeaf:
    index: int
    event_id: uuid.UUID
    case_id: uuid.UUID
    event_hash: str
    kind: str = "event"


@dataclass(frozen=True)
class Recovered:
    appended: int
    size: int
    cases: int


def leaves_in_bundles(directory: Path) -> dict[int, LostLeaf]:
    """Every logged event the bundles in ``directory`` hold, by leaf index: only those
    whose signed bytes hash to the chain hash they name."""
    found: dict[int, LostLeaf] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            bundle = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if not isinstance(bundle, dict):
            continue
        for event in bundle.get("events", []):
            leaf = _leaf(event)
            if leaf is not None:
                found.setdefault(leaf.index, leaf)
        if (leaf := _leaf(bundle.get("record"), "backtest")) is not None:
            found.setdefault(leaf.index, leaf)
    return found


def _leaf(signed: Any, kind: str = "event") -> LostLeaf | None:
    """An event of a bundle, or a backtest bundle's record (``kind`` ``backtest``:
    service/audit/backtest_record.py), as its leaf: only when its signed bytes hash to
    the chain hash it names."""
    try:
        proof = TlogProof.parse(signed["logProof"])
        body, integrity = signed["body"], signed["integrity"]
        if chain_hash(integrity["prevHash"], body.encode()) != integrity["hash"]:
            return None
        named = orjson.loads(body)
        ids = (named["eventId"], named["caseId"]) if kind == "event" \
            else (named["backtestId"], named["backtestId"])
        return LostLeaf(proof.index, uuid.UUID(ids[0]), uuid.UUID(ids[1]), integrity["hash"],
                        kind)
    except (KeyError, TypeError, ValueError, NoteError):
        return None


def _missing(wanted: range, found: dict[int, LostLeaf]) -> str:
    gaps = [i for i in wanted if i not in found]
    shown = ", ".join(str(i) for i in gaps[:10])
    return shown + (f" and {len(gaps) - 10} more" if len(gaps) > 10 else "")


async def recover(settings: Settings, directory: Path) -> Recovered:
    """Append the lost range from the bundles in ``directory``; ``PermanentError`` with
    what is missing or wrong, having written nothing."""
    async with stopped_ledger(settings, "recover") as ledger:
        if not ledger.anchors:
            raise PermanentError("the log's high-water mark is unknown: there is nothing "
                                 "to recover to (see `ledger accept-size`)")
        mark = max(ledger.anchors, key=lambda a: a.head.size)
        conn = ledger.conn
        async with appending(conn):
            edge = await read_edge(conn)
            lost = range(edge.size, mark.head.size)
            found = await asyncio.to_thread(leaves_in_bundles, directory)
            leaves = _complete(lost, found, mark)
            await write_leaves(conn, edge.size,
                               [(leaf.event_id, leaf.case_id, leaf.event_hash, leaf.kind)
                                for leaf in leaves], _extended(edge, leaves, mark))
    return Recovered(len(leaves), mark.head.size, len({leaf.case_id for leaf in leaves}))


def _complete(lost: range, found: dict[int, LostLeaf], mark: Anchor) -> list[LostLeaf]:
    if not lost:
        raise PermanentError(f"the stored tree holds {mark.describe()}: nothing was lost")
    if any(i not in found for i in lost):
        raise PermanentError(
            f"the stored tree has {lost.start} leaves and the log signed {mark.describe()}; "
            f"the bundles hold no event for leaves {_missing(lost, found)}. A tree cannot "
            "hold a gap: nothing was appended")
    return [found[i] for i in lost]


def _extended(edge: merkle.Edge, leaves: list[LostLeaf], mark: Anchor
              ) -> dict[merkle.Tile, bytes]:
    grown = edge.copy()
    tiles = grown.append([merkle.leaf_hash(bytes.fromhex(leaf.event_hash))
                          for leaf in leaves])
    if grown.root() != mark.head.root:
        raise PermanentError(f"the bundles' events do not rebuild {mark.describe()} (another "
                             "root at that size): nothing was appended")
    return tiles

