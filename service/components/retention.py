"""The worker's retention pass (docs/design.md, "Keeping records as long as the law
says"; docs/operations.md, "Retention and legal holds").

Every ``interval`` seconds, one pass, bounded in cases and in time. It keeps the log's
monthly partitions made two years ahead (the owner's ``event_log_prepare_partitions``:
nothing to do but once a month), appends a signed
``CASE_HELD`` to each ended case a legal hold keeps (once per hold) and ``CASE_RELEASED``
once that hold ended; then, only when some policy in force deletes anything (the default
keeps everything) and the database lacks nothing the retention journal holds, it

1. expires the cases whose ``CASE_EXPIRED`` is stored (the tombstone is there): the
   owner's ``expire_case`` checks the tombstone, the holds and that the log has every
   event, then deletes the events and the case row; a month of the log whose every
   case has expired (and that ended the floor's six months ago) is then dropped whole
   by the owner's ``event_log_drop_expired_partitions``, its CASE_EXPIRED rows kept;
2. erases the personal data of cases past their policy's earlier deadline: appends the
   signed ``CASE_ERASED``, and the database shreds the values when it stores it (a
   case past both deadlines is erased first, and expires the next pass, chained on it);
3. appends a signed ``CASE_EXPIRED`` (the policy, the events it removes, each attempt's
   final chain hash) to each case past its time that no hold keeps; the next pass
   removes its events, once the consumer has stored it. Under a policy that archives,
   the case's bundle is written to the archive first (``casetrail.audit.archive``, once
   the log holds all of its events) and the event names the file and its digest.

A crash anywhere leaves a state the next pass finishes: a case with a tombstone still
holding events is step 1, one without is step 3 again (the event's id is derived from
its place, so a second copy is the same event). Only the worker signs events, so the
pass runs here; several workers' passes may overlap harmlessly.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from casetrail.adapters.bus.journal import journalled
from casetrail.adapters.store import CaseSecrets, CaseStore
from casetrail.adapters.store.expiry import ExpiryStore, NotYet, PastTime
from casetrail.adapters.store.ledger import LedgerStore
from casetrail.adapters.store.pool import HeldByLaw
from casetrail.adapters.store.retention import earlier_policies
from casetrail.audit.archive import Archived, ArchiveWriter, CaseArchiver
from casetrail.audit.archive_store import open_archive
from casetrail.audit.evidence import Evidence
from casetrail.components.duties import Host
from casetrail.contract.events import (
    EXPIRED_EVENT_TYPE,
    ArchivedBundle,
    CaseErasedPayload,
    CaseExpiredPayload,
    CaseHeldPayload,
    CaseReleasedPayload,
    Event,
    make_event,
)
from casetrail.errors import CasetrailError
from casetrail.telemetry import metrics
from casetrail.trail import retention_actions

log = logging.getLogger("casetrail.retention")


@dataclass
class PassOutcome:
    """What one pass did."""

    expired: int = 0
    events_removed: int = 0
    erased: int = 0
    expiries_appended: int = 0
    archived: int = 0
    awaiting_archive: int = 0
    """Cases past their time under a policy that archives, not archived yet (the log
    does not hold all their events yet, or no archive is configured)."""
    held: int = 0
    holds_recorded: int = 0
    """CASE_HELD and CASE_RELEASED appended."""
    blocked: int = 0
    """Journal entries the database lacks: while any, the pass does nothing."""
    partitions_dropped: list[str] = field(default_factory=list)
    """The log's monthly partitions dropped whole (every case in them expired)."""


@dataclass
class RetentionKeeper:
    """Runs the retention pass for one worker."""

    store: ExpiryStore
    cases: CaseStore
    secrets: CaseSecrets
    append: Callable[[Event, str], Awaitable[None]]
    """The worker's signed append: the event, the hash it chains on."""
    ran_by: str
    journal: Callable[[], Awaitable[list[dict[str, Any]]]]
    """The retention journal's entries (casetrail.adapters.bus.journal)."""
    action_keys: Callable[[], Awaitable[Mapping[str, Any]]]
    """The registered action keys, which persons' acts about retention must verify under."""
    archiver: CaseArchiver | None = None
    """Writes the bundles of cases whose policy archives them (none: such cases wait)."""
    interval: float = 300.0
    batch: int = 500
    seconds: float = 60.0

    async def run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except CasetrailError as exc:
                log.warning("retention pass failed, tried again in %.0f s: %s",
                            self.interval, exc)
            await asyncio.sleep(self.interval)

    async def pass_once(self) -> PassOutcome:
        outcome = PassOutcome()
        until = time.monotonic() + self.seconds
        touched: set[uuid.UUID] = set()
        if made := await self.store.prepare_partitions():
            log.info("event_log: %d monthly partitions made ahead", made)
        outcome.holds_recorded = await self._record_holds(touched, until)
        if not await self.store.any_policy():
            self._gauges(0, 0, None)
            return outcome
        outcome.blocked = await self._unreconciled()
        if outcome.blocked:
            return outcome
        keys = await self.action_keys()
        trusted = await self._trusted_policies(keys)
        await self._expire_tombstoned(outcome, keys, until)
        for case in await self.store.to_erase(self.batch, trusted):
            if time.monotonic() > until:
                break
            if case.held or case.case_id in touched or \
                    await self._released_unsigned(case.case_id, keys):
                continue
            if await self._erase(case):
                outcome.erased += 1
                touched.add(case.case_id)
        due = []
        for case in await self.store.to_expire(self.batch, trusted):
            if time.monotonic() > until:
                break
            if case.held or await self._released_unsigned(case.case_id, keys):
                outcome.held += 1
            elif case.case_id not in touched:
                # (a CASE_ERASED appended now is not stored yet: its expiry chains on it
                # next pass)
                due.append(case)
        archived = await self._archive([c for c in due if c.archive], outcome)
        for case in due:
            if case.archive and case.case_id not in archived:
                outcome.awaiting_archive += 1
            elif await self._append_expiry(case, archived.get(case.case_id)):
                outcome.expiries_appended += 1
        backlog = await self.store.backlog(trusted)
        self._gauges(backlog.past_time, backlog.held, backlog.oldest_due)
        return outcome

    async def _expire_tombstoned(self, outcome: PassOutcome, keys: Mapping[str, Any],
                                 until: float) -> None:
        """Step 1: the cases whose CASE_EXPIRED is stored lose their other events."""
        for case_id in await self.store.tombstoned(self.batch):
            if time.monotonic() > until:
                break
            if await self._released_unsigned(case_id, keys):
                continue
            try:
                removed = await self.store.expire(case_id)
            except (HeldByLaw, NotYet) as exc:
                log.info("case %s not expired this pass: %s", case_id, exc)
                continue
            outcome.expired += 1
            outcome.events_removed += removed
            metrics.RETENTION_EXPIRED.inc()
            metrics.RETENTION_EVENTS_REMOVED.inc(removed)
            log.info("case %s expired: %d events deleted, its tombstone kept", case_id,
                     removed)
        outcome.partitions_dropped = await self.store.drop_expired_partitions()
        for name in outcome.partitions_dropped:
            log.info("event_log: partition %s dropped, every case in it expired", name)

    async def _trusted_policies(self, keys: Mapping[str, Any]) -> list[int]:
        """The policies in force whose version, and approval where it needs one, an
        action key signed as the rows say: nothing is deleted under any other."""
        trusted = []
        for row in await self.store.policies_in_force():
            why = retention_actions.problem(retention_actions.policy_object(row),
                                            row["action"], keys)
            if why is None and (row["needs_second"] or retention_actions.needs_second_person(
                    row, await earlier_policies(self.store.pool, row["tenant_id"], row["agent"],
                                                row["version"]), keys)):
                why = "no second person approved it" if row["approved_by"] is None else \
                    retention_actions.problem(retention_actions.approval_object(
                        row["tenant_id"], row["agent"], row["version"], row["approved_by"],
                        row["approved_at"]), row["approval_action"], keys)
            if why is None:
                trusted.append(row["policy_id"])
                continue
            metrics.RETENTION_REFUSED.labels("policy").inc()
            log.error("retention policy %d (tenant %s, agent %s, version %d) is not acted "
                      "on: %s", row["policy_id"], row["tenant_id"], row["agent"],
                      row["version"], why)
        return trusted

    async def _released_unsigned(self, case_id: uuid.UUID, keys: Mapping[str, Any]) -> bool:
        """Whether a hold on the case counts as released only by releases no action key
        signed (two persons' signed releases end a hold; rows alone do not)."""
        for hold in await self.store.releases_keeping(case_id):
            signed = {r["person"] for r in hold["releases"] if retention_actions.problem(
                retention_actions.release_object(hold["hold_id"], r["person"], r["reason"],
                                                 datetime.fromisoformat(r["releasedAt"])),
                r["action"], keys) is None}
            if len(signed) < 2:
                metrics.RETENTION_REFUSED.labels("release").inc()
                log.error("case %s: hold %s counts as released by releases no action key "
                          "signed; the case stays held", case_id, hold["hold_id"])
                return True
        return False

    async def _unreconciled(self) -> int:
        """How many journal entries the database lacks (a restore of an older backup
        that ``casetrail setup`` has not reconciled yet): nothing expires meanwhile."""
        entries = await self.journal()
        lacking = await self.store.journal_missing(entries)
        metrics.RETENTION_BLOCKED.set(1 if lacking else 0)
        if lacking:
            log.error("retention does not run: the database lacks %d of the %d holds, "
                      "releases, policies and erasures its journal holds (first: %s); a "
                      "restore is not reconciled: run `casetrail setup`", len(lacking),
                      len(entries), entries[lacking[0]].get("kind"))
        return len(lacking)

    @staticmethod
    def _gauges(past_time: int, held: int, oldest: datetime | None) -> None:
        metrics.RETENTION_PAST_TIME.set(past_time)
        metrics.RETENTION_HELD.set(held)
        metrics.RETENTION_OLDEST_PAST_SECONDS.set(
            0 if oldest is None else max(0.0, (datetime.now(UTC) - oldest).total_seconds()))

    async def _record_holds(self, touched: set[uuid.UUID], until: float) -> int:
        """CASE_HELD on each ended case a hold keeps, CASE_RELEASED once it no longer
        does; one event a case a pass (the next chains on it, once stored)."""
        recorded = 0
        for hold in [*await self.store.releases_to_record(self.batch),
                     *await self.store.holds_to_record(self.batch)]:
            if time.monotonic() > until or hold.case_id in touched:
                continue
            head = await self.cases.trail_head(hold.case_id)
            if head is None or head.event_type == EXPIRED_EVENT_TYPE:
                continue
            payload: CaseHeldPayload | CaseReleasedPayload = (
                CaseReleasedPayload(hold_id=hold.hold_id, released_by=hold.released_by,
                                    ended_at=hold.ended_at)
                if hold.ended_at is not None else
                CaseHeldPayload(hold_id=hold.hold_id, scope=hold.scope, reason=hold.reason,
                                placed_by=hold.placed_by, placed_at=hold.placed_at,
                                ends_at=hold.ends_at))
            await self.append(make_event(hold.case_id, head.attempt, head.seq + 1, payload,
                                         tenant_id=head.tenant_id), head.hash)
            touched.add(hold.case_id)
            recorded += 1
        return recorded

    async def _erase(self, case: PastTime) -> bool:
        """Append the signed CASE_ERASED of a case past its policy's erasure deadline; the
        database shreds its values when it stores that event (and not for a case a
        hold has kept since)."""
        state = await self.secrets.state(case.case_id)
        head = await self.cases.trail_head(case.case_id)
        if state is None or state.erased_at is not None or head is None or head.erased:
            return False
        by = f"retention:policy-{case.policy_id}-v{case.version}"
        await self.append(make_event(case.case_id, head.attempt, head.seq + 1,
                                     CaseErasedPayload(erased_by=by, erased_at=datetime.now(UTC),
                                                       placeholders=state.placeholders),
                                     tenant_id=head.tenant_id), head.hash)
        metrics.RETENTION_ERASED.inc()
        log.info("case %s: personal data erased on its policy's deadline", case.case_id)
        return True

    async def _archive(self, cases: list[PastTime], outcome: PassOutcome
                       ) -> dict[uuid.UUID, Archived]:
        """The bundles of the cases whose policy archives them, written before they
        expire (``to_expire`` gives only cases without a stored CASE_EXPIRED)."""
        if not cases:
            return {}
        if self.archiver is None:
            log.error("%d cases wait to expire: their policy archives them and this worker "
                      "has no archive", len(cases))
            return {}
        try:
            archived = await self.archiver.archive([case.case_id for case in cases])
        except OSError as exc:
            metrics.RETENTION_ARCHIVE_FAILURES.inc()
            log.error("the archive could not be written, so no case of a policy that "
                      "archives expires this pass: %s", exc)
            return {}
        outcome.archived += len(archived)
        metrics.RETENTION_ARCHIVED.inc(len(archived))
        return archived

    async def _append_expiry(self, case: PastTime, archived: Archived | None = None) -> bool:
        head = await self.cases.trail_head(case.case_id)
        if head is None or head.event_type == EXPIRED_EVENT_TYPE:
            return False  # nothing stored, or appended already (its tombstone follows)
        assert case.keep_days is not None
        events, heads = await self.store.chain_heads(case.case_id)
        payload = CaseExpiredPayload(
            policy_id=case.policy_id, policy_version=case.version, kept_days=case.keep_days,
            counted_from=case.counted_from, events_removed=events, heads=tuple(heads),
            expired_by=self.ran_by,
            archive=None if archived is None else ArchivedBundle(**archived.as_payload()))
        await self.append(make_event(case.case_id, head.attempt, head.seq + 1, payload,
                                     tenant_id=head.tenant_id), head.hash)
        log.info("case %s: CASE_EXPIRED appended (policy %d v%d, %d events)", case.case_id,
                 case.policy_id, case.version, events)
        return True


def retaining(interval: float, archive_dir: Path | str | None,
              archive_s3_endpoint: str | None = None) -> Callable[[Host], RetentionKeeper]:
    """The retention pass as a worker's duty, every ``interval`` seconds, archiving to
    ``archive_dir`` (a directory or an ``s3://`` URL; none: cases whose policy archives
    them wait)."""

    def keeper(host: Host) -> RetentionKeeper:
        ran_by = f"retention:{host.owner}"
        archiver = None
        if archive_dir is not None:  # each manifest signed with the worker's key
            evidence = Evidence(host.store, host.keys, LedgerStore(host.store.pool))
            archiver = CaseArchiver(evidence, host.secrets, ArchiveWriter(
                open_archive(archive_dir, archive_s3_endpoint), host.signer, ran_by))
        return RetentionKeeper(
            ExpiryStore(host.store.pool), host.store, host.secrets, host.append, ran_by,
            lambda: journalled(host.connection, host.topology), host.action_keys,
            archiver=archiver, interval=interval)

    return keeper
