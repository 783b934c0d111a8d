"""What ``casetrail audit`` reads and keeps (casetrail.audit.whole_log): the leaves and
stored events that do not match, the append-only triggers switched off, the checkpoints
witnesses cosigned, and the audit's own passes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from casetrail.adapters.store.cases import ParkedAction
from casetrail.contract.integrity import Integrity
from casetrail.trail.person_actions import SignedAction

APPEND_ONLY_TABLES = ("event_log", "ledger_leaves", "ledger_tiles", "ledger_checkpoints",
                      "ledger_acceptances", "access_log", "audit_runs", "case_tombstones",
                      "retention_policies", "retention_approvals", "retention_business_dates",
                      "legal_holds", "legal_hold_releases", "backtest_results",
                      "backtest_records")
"""The tables whose triggers refuse a change: one switched off is a finding."""


@dataclass(frozen=True)
class Mismatch:
    """A leaf without its record, a record unlike its leaf, or a record without a leaf."""

    case_id: uuid.UUID
    leaf_index: int | None
    event_id: uuid.UUID
    stored_hash: str | None
    leaf_hash: str | None


@dataclass(frozen=True)
class LastRun:
    to_leaf: int
    failing_cases: list[uuid.UUID]
    failing_backtests: list[uuid.UUID] = field(default_factory=list)
    unreadable: str | None = None
    """Why the last run's row cannot be read as a run (then nothing in it is trusted)."""
    scrubbed_to: uuid.UUID | None = None
    """The last case its scrub re-verified (``None``: the next scrub starts at the first)."""


def read_run(run_id: int, to_leaf: Any, stored: Any, tree_size: int,
              scrubbed_to: Any) -> LastRun:
    """The last run as kept, or one that says why it cannot be read: a row the audit did
    not write (findings not a list of findings, a size past the tree's) never stops a
    pass, and never lets one skip what it would otherwise check."""
    try:
        findings = orjson.loads(stored) if isinstance(stored, str | bytes) else stored
        if not isinstance(findings, list) or not all(isinstance(f, dict) for f in findings):
            raise ValueError("its findings are not a list of findings")
        if not isinstance(to_leaf, int) or not 0 <= to_leaf <= tree_size:
            raise ValueError(f"it ends at leaf {to_leaf!r} of a tree of {tree_size}")
        failing = sorted({uuid.UUID(f["caseId"]) for f in findings if f.get("caseId")})
        backtests = sorted({uuid.UUID(f["backtestId"]) for f in findings
                            if f.get("backtestId")})
    except (ValueError, TypeError, AttributeError) as exc:
        return LastRun(0, [], [], f"audit run {run_id} cannot be read as a pass ({exc})")
    return LastRun(to_leaf, failing, backtests, scrubbed_to=_case_id_or_none(scrubbed_to))


def _case_id_or_none(value: Any) -> uuid.UUID | None:
    """Where a kept scrub stopped (a UUID, or its text), ``None`` when it names none: the
    next scrub then starts at the first case."""
    if isinstance(value, uuid.UUID) or value is None:
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


CHAIN_MOVED = "CTARC"
"""The SQLSTATE migration 037's trigger raises for a run that does not follow the last."""


class ChainMoved(Exception):
    """Another pass was kept where this one was to go (two auditors at once)."""


@dataclass
class Scrubbed:
    """What a pass's scrub did: the last case it re-verified (``None``: it ended a lap,
    the next starts at the first), how many, and whether it came round to where it
    began."""

    to: uuid.UUID | None
    cases: int = 0
    lapped: bool = False


@dataclass(frozen=True)
class Refused:
    """A person's action a worker refused (``case_actions_refused``), as it was kept."""

    case_id: uuid.UUID
    tenant_id: str
    agent: str
    started_by: str | None
    action: ParkedAction
    why_code: str
    why: str


def _signed_or_none(row: Any) -> SignedAction | None:
    if row["signed"] is None or row["key_id"] is None or row["sig"] is None:
        return None
    return SignedAction(row["signed"], row["key_id"], row["sig"])


@dataclass(frozen=True)
class AuditStore:
    pool: asyncpg.Pool

    async def tree_size(self) -> int:
        return int(await self.pool.fetchval(
            "SELECT coalesce(max(leaf_index) + 1, 0) FROM ledger_leaves"))

    async def kept_runs(self) -> list[dict[str, Any]]:
        """Every pass kept, in the order kept, with its signed record (none for a pass
        kept before schema 37)."""
        rows = await self.pool.fetch(
            "SELECT run_id, started_at, finished_at, full_pass, from_leaf, to_leaf, "
            "cases_checked, findings, scrubbed_to, cases_scrubbed, scrub_lapped, "
            "chain_seq, body, prev_hash, hash, key_id, sig FROM audit_runs ORDER BY run_id")
        return [dict(r) for r in rows]

    async def cases_after(self, after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
        """Up to ``limit`` cases (stored, or expired with their tombstone) in case-id order,
        after ``after`` (``None``: from the first): the scrub's next ones."""
        rows = await self.pool.fetch(
            "(SELECT case_id FROM cases WHERE $1::uuid IS NULL OR case_id > $1 "
            "ORDER BY case_id LIMIT $2) UNION (SELECT case_id FROM case_tombstones "
            "WHERE $1::uuid IS NULL OR case_id > $1 ORDER BY case_id LIMIT $2) "
            "ORDER BY case_id LIMIT $2", after, limit)
        return [r["case_id"] for r in rows]

    async def cases_logged_from(self, first_leaf: int) -> list[uuid.UUID]:
        """The cases with a leaf at ``first_leaf`` or after, in the order first logged."""
        rows = await self.pool.fetch(
            "SELECT case_id FROM ledger_leaves WHERE leaf_index >= $1 AND kind = 'event' "
            "GROUP BY case_id ORDER BY min(leaf_index)", first_leaf)
        return [r["case_id"] for r in rows]

    async def refusals(self) -> list[Refused]:
        """Every person's action a worker refused, with its case's tenant, agent and
        starter, oldest first."""
        rows = await self.pool.fetch(
            "SELECT r.*, c.tenant_id, c.agent, c.started_by FROM case_actions_refused r "
            "JOIN cases c USING (case_id) ORDER BY r.refusal_id")
        return [Refused(r["case_id"], r["tenant_id"], r["agent"], r["started_by"],
                        ParkedAction(r["parked_attempt"], r["kind"], r["verdict"],
                                     r["reason"], r["decision"], r["reviewer"],
                                     r["acted_at"], _signed_or_none(r)),
                        r["why_code"], r["why"]) for r in rows]

    async def erasures_unrecorded(self) -> list[uuid.UUID]:
        """Cases whose sensitive values are erased but whose trail holds no CASE_ERASED:
        shredded outside the record (the owner's trigger shreds only as it stores one)."""
        rows = await self.pool.fetch(
            "SELECT s.case_id FROM case_secrets s WHERE s.erased_at IS NOT NULL AND NOT "
            "EXISTS (SELECT 1 FROM event_log e WHERE e.case_id = s.case_id "
            "AND e.event_type = 'CASE_ERASED') ORDER BY 1")
        return [r["case_id"] for r in rows]

    async def erasures_unapplied(self, cases: list[uuid.UUID]) -> list[uuid.UUID]:
        """Of ``cases``, those whose trail holds a CASE_ERASED while their values are
        still kept (a hold placed while the erasure travelled)."""
        rows = await self.pool.fetch(
            "SELECT s.case_id FROM case_secrets s WHERE s.case_id = ANY($1::uuid[]) AND "
            "s.erased_at IS NULL AND EXISTS (SELECT 1 FROM event_log e WHERE e.case_id = "
            "s.case_id AND e.event_type = 'CASE_ERASED') ORDER BY 1", cases)
        return [r["case_id"] for r in rows]

    async def leaves_unmatched(self) -> list[Mismatch]:
        """Event leaves whose event is not stored, or stored with another hash; but the
        events an expiry removed (its case row gone with them, its tombstone kept),
        which ``expiries_unaccounted`` and the expired trail's verdict answer for."""
        rows = await self.pool.fetch(
            "SELECT l.case_id, l.leaf_index, l.event_id, e.hash AS stored, "
            "l.event_hash AS leaf FROM ledger_leaves l LEFT JOIN event_log e "
            "USING (case_id, event_id) WHERE l.kind = 'event' AND (e.event_id IS NULL "
            "OR e.hash IS DISTINCT FROM l.event_hash) AND NOT (e.event_id IS NULL AND "
            "EXISTS (SELECT 1 FROM case_tombstones t WHERE t.case_id = l.case_id AND "
            "t.event_id <> l.event_id) AND NOT EXISTS (SELECT 1 FROM cases c WHERE "
            "c.case_id = l.case_id)) ORDER BY l.leaf_index")
        return [Mismatch(r["case_id"], r["leaf_index"], r["event_id"], r["stored"],
                         r["leaf"]) for r in rows]

    async def expiries_unaccounted(self) -> list[uuid.UUID]:
        """Expired cases (tombstone kept, case row gone) whose stored CASE_EXPIRED is not
        the tombstone's, or whose other leaves are not the number it removed."""
        rows = await self.pool.fetch(
            "SELECT t.case_id FROM case_tombstones t WHERE NOT EXISTS (SELECT 1 FROM cases "
            "c WHERE c.case_id = t.case_id) AND (NOT EXISTS (SELECT 1 FROM event_log e "
            "WHERE e.case_id = t.case_id AND e.event_id = t.event_id "
            "AND e.hash = t.event_hash) OR (SELECT count(*) "
            "FROM ledger_leaves l WHERE l.case_id = t.case_id AND l.kind = 'event' AND "
            "l.event_id <> t.event_id) <> t.events_removed) ORDER BY t.expired_at")
        return [r["case_id"] for r in rows]

    async def expired_count(self, excluding: Sequence[uuid.UUID] = ()) -> int:
        """Expired cases (tombstone kept, case row gone), but those of ``excluding``."""
        return int(await self.pool.fetchval(
            "SELECT count(*) FROM case_tombstones t WHERE NOT EXISTS (SELECT 1 FROM cases c "
            "WHERE c.case_id = t.case_id) AND NOT t.case_id = ANY($1::uuid[])",
            list(dict.fromkeys(excluding))))

    async def events_unlogged(self) -> list[Mismatch]:
        """Stored events that are neither a leaf nor waiting in the ledger's queue."""
        rows = await self.pool.fetch(
            "SELECT e.case_id, e.event_id, e.hash FROM event_log e WHERE NOT EXISTS "
            "(SELECT 1 FROM ledger_leaves l WHERE l.event_id = e.event_id) AND NOT EXISTS "
            "(SELECT 1 FROM ledger_queue q WHERE q.event_id = e.event_id)")
        return [Mismatch(r["case_id"], None, r["event_id"], r["hash"], None) for r in rows]

    async def backtests_unmatched(self) -> list[Mismatch]:
        """Backtest leaves whose record is not stored, or stored with another hash; and
        records that are neither a leaf nor waiting for the ledger (``leaf_index`` None)."""
        rows = await self.pool.fetch(
            "SELECT l.case_id, l.leaf_index, l.event_id, r.hash AS stored, "
            "l.event_hash AS leaf FROM ledger_leaves l LEFT JOIN backtest_records r "
            "ON r.backtest_id = l.event_id WHERE l.kind = 'backtest' "
            "AND r.hash IS DISTINCT FROM l.event_hash "
            "UNION ALL SELECT r.backtest_id, NULL, r.backtest_id, r.hash, NULL "
            "FROM backtest_records r WHERE NOT EXISTS (SELECT 1 FROM ledger_leaves l "
            "WHERE l.event_id = r.backtest_id) AND NOT EXISTS (SELECT 1 FROM ledger_queue q "
            "WHERE q.event_id = r.backtest_id)")
        return [Mismatch(r["case_id"], r["leaf_index"], r["event_id"], r["stored"],
                         r["leaf"]) for r in rows]

    async def backtest_records(self, first_leaf: int = 0, also: Sequence[uuid.UUID] = ()
                               ) -> list[dict[str, Any]]:
        """The backtest records logged at ``first_leaf`` or after or not logged yet (every
        one from 0), and those of ``also``, in the chain's order; each with the hash of
        the record before it in the chain (``before``, none for the first)."""
        rows = await self.pool.fetch(
            "WITH chain AS (SELECT backtest_id, lag(hash) OVER (ORDER BY chain_seq) AS before "
            "FROM backtest_records) "
            "SELECT r.backtest_id, r.chain_seq, r.body, r.prev_hash, r.hash, r.key_id, r.sig, "
            "c.before FROM backtest_records r JOIN chain c USING (backtest_id) "
            "WHERE $1 = 0 OR r.backtest_id = ANY($2::uuid[]) OR NOT EXISTS (SELECT 1 "
            "FROM ledger_leaves l WHERE l.event_id = r.backtest_id AND l.kind = 'backtest' "
            "AND l.leaf_index < $1) ORDER BY r.chain_seq", first_leaf, list(also))
        return [dict(r) for r in rows]

    async def partitions_unguarded(self) -> list[tuple[str, list[str]]]:
        """(partition, what it lacks) of each of the log's partitions that lacks its
        unique key on (case_id, attempt, seq) (exactly once rests on it), its own
        TRUNCATE trigger, the constraint that holds its columns to the signed bytes
        (migration 033: dropped, an owner can rewrite ``payload``), or that grants a role
        anything (reached directly, a partition bypasses the log's triggers and row
        policies)."""
        rows = await self.pool.fetch(
            "SELECT c.relname, ARRAY_REMOVE(ARRAY["
            "CASE WHEN NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid "
            "AND x.indisunique AND pg_get_indexdef(x.indexrelid) "
            "LIKE '%(case_id, attempt, seq)%') THEN 'its unique key' END, "
            "CASE WHEN NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid "
            "AND t.tgname = 'event_log_no_truncate' AND t.tgenabled <> 'D') "
            "THEN 'its TRUNCATE trigger' END, "
            "CASE WHEN NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.oid "
            "AND k.conname = 'event_log_restates_body' AND k.contype = 'c') "
            "THEN 'its constraint holding the columns to the signed bytes' END, "
            "CASE WHEN EXISTS (SELECT 1 FROM aclexplode(c.relacl) a "
            "WHERE a.grantee <> c.relowner) THEN 'no grants' END], NULL) AS lacks "
            "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'event_log'::regclass ORDER BY 1")
        return [(r["relname"], list(r["lacks"])) for r in rows if r["lacks"]]

    async def triggers_off(self) -> list[tuple[str, str]]:
        """(table, trigger) of every append-only trigger that is switched off now."""
        rows = await self.pool.fetch(
            "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c "
            "ON c.oid = t.tgrelid WHERE NOT t.tgisinternal AND t.tgenabled = 'D' "
            "AND c.relnamespace = 'public'::regnamespace AND (c.relname = ANY($1::text[]) "
            "OR c.oid IN (SELECT inhrelid FROM pg_inherits "
            "WHERE inhparent = 'event_log'::regclass)) ORDER BY 1, 2", list(APPEND_ONLY_TABLES))
        return [(r["relname"], r["tgname"]) for r in rows]

    async def witnessed_sizes(self, since: int) -> list[tuple[int, bytes]]:
        """(size, root) of each cosigned checkpoint of ``since`` leaves or more, and of
        the latest checkpoint."""
        rows = await self.pool.fetch(
            "SELECT tree_size, root_hash FROM ledger_checkpoints c WHERE (tree_size >= $1 "
            "AND EXISTS (SELECT 1 FROM ledger_cosignatures s WHERE s.tree_size = "
            "c.tree_size)) OR tree_size = (SELECT max(tree_size) FROM ledger_checkpoints) "
            "ORDER BY tree_size", since)
        return [(r["tree_size"], bytes(r["root_hash"])) for r in rows]

    async def chain_end(self) -> tuple[int, str] | None:
        """(seq, hash) of the last signed run, which the next must follow."""
        row = await self.pool.fetchrow("SELECT chain_seq, hash FROM audit_runs WHERE "
                                       "chain_seq IS NOT NULL ORDER BY chain_seq DESC LIMIT 1")
        return None if row is None else (row["chain_seq"], row["hash"])

    async def keep_run(self, fields: dict[str, Any], chain_seq: int, body: bytes,
                       seal: Integrity) -> None:
        """Keep a pass: its signed record (``body`` under ``seal``) and the columns that
        restate its ``fields``. ``ChainMoved`` when another pass was kept at its place in
        the chain first."""
        f = fields
        try:
            await self.pool.execute(
                "INSERT INTO audit_runs (started_at, finished_at, full_pass, from_leaf, "
                "to_leaf, cases_checked, findings, scrubbed_to, cases_scrubbed, scrub_lapped, "
                "chain_seq, body, prev_hash, hash, key_id, sig) VALUES ($1, $2, $3, $4, $5, "
                "$6, $7::jsonb, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
                datetime.fromisoformat(f["startedAt"]), datetime.fromisoformat(f["finishedAt"]),
                f["fullPass"], f["fromLeaf"], f["toLeaf"], f["casesChecked"], f["findings"],
                uuid.UUID(f["scrubbedTo"]) if f["scrubbedTo"] else None, f["casesScrubbed"],
                f["scrubLapped"], chain_seq, body, seal.prev_hash, seal.hash, seal.key_id,
                seal.sig)
        except asyncpg.PostgresError as exc:
            if getattr(exc, "sqlstate", None) == CHAIN_MOVED:
                raise ChainMoved(str(exc)) from None
            raise
