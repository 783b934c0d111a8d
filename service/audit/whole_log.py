"""``casetrail audit``: the whole log checked in one command (docs/design.md, "One command
audits the whole log"; docs/operations.md, "Auditing the whole log").

``casetrail verify`` answers for one case an auditor names. An owner who switches the
append-only triggers off, deletes some cases and switches them on again is found only if
somebody asks about exactly those cases. The audit asks about all of them:

- every event leaf has its stored event, with the hash the leaf holds
  (``removed_after_logging``, ``altered``), and every stored event is a leaf or waits for
  the ledger (``not_logged``);
- every case logged since the last pass (and every case that failed it) verifies as a
  trail: chain, signatures, signed actions, one terminal event (``altered`` naming the
  problems);
- the stored tree still has the root of every checkpoint a witness cosigned since the
  last pass, and of the latest one (``checkpoint_inconsistent``);
- no append-only trigger is switched off now (``trigger_disabled``), and each of the
  log's monthly partitions has its unique key, TRUNCATE trigger and the constraint that
  holds its columns to the signed bytes, and grants nothing (``partition_unguarded``);
- a case's values are erased only with its CASE_ERASED stored, and a newly logged
  CASE_ERASED has its values gone (``erasure_unrecorded``);
- every case verified also shows in its row what its signed trail says (``altered``,
  naming ``projection_mismatch``);
- every person's action a worker refused, judged again by the worker's own rule against
  the record as it stood, was rightly refused (``refused_valid_action``);
- an expired case (its events deleted by policy, its tombstone kept) is ``expired``,
  not a finding: every pass checks each tombstone against its stored ``CASE_EXPIRED``
  and the number of the case's leaves, and the expired trail's verdict (signature,
  chain heads against the leaves) runs when its ``CASE_EXPIRED`` is newly logged.

A pass is kept in ``audit_runs``; the next goes on from where it stopped (``--full``
starts from the first leaf). The joins over leaves and events run every pass; a trail's
signatures when it is newly logged, while it fails, and whenever the scrub comes round
to it: each pass re-verifies stored cases in turn for ``scrub_seconds``, going on from
where the last one stopped, so an edit the joins cannot see (a payload rewritten with
its hash kept) is found within a lap. Each pass is kept signed under the auditor's
key and chained (casetrail.audit.audit_runs); the next goes on from the last one's
signed bytes. A run forged, altered or removed is a finding (``audit_run_altered``), and
when the last one is not believed, or cannot be read as a pass
(``audit_run_unreadable``), the pass checks everything. Findings are per case where
there is a case.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from casetrail.adapters.store import CaseStore, KeyRegistry, create_pool
from casetrail.adapters.store.audit_log import (
    AuditStore,
    ChainMoved,
    LastRun,
    Mismatch,
    Scrubbed,
    read_run,
)
from casetrail.adapters.store.backtests import BacktestStore
from casetrail.adapters.store.ledger import LedgerStore
from casetrail.agents import AGENTS
from casetrail.audit.audit_runs import (
    Auditor,
    ChainRead,
    read_chain,
    remember,
    remembered,
    removed_since,
    seal_run,
)
from casetrail.audit.backtest_record import record_problems
from casetrail.audit.evidence import Evidence
from casetrail.audit.kept_actions import acting_identity, kept_action_refusal
from casetrail.audit.resume import record_so_far
from casetrail.config import Settings
from casetrail.contract.integrity import GENESIS
from casetrail.telemetry import metrics

SCRUB_SECONDS: float = Settings.model_fields["audit_scrub_seconds"].default
"""A pass's scrub, by default (``CASETRAIL_AUDIT_SCRUB_SECONDS``'s default)."""
SCRUB_BATCH = 200
"""Cases the scrub reads ahead at a time."""
KEEP_ATTEMPTS = 5
"""Times a pass tries to keep itself at the chain's end while other auditors keep
theirs there first."""


class FindingKind(StrEnum):
    REMOVED_AFTER_LOGGING = "removed_after_logging"
    """The log holds events of the case that are no longer stored."""
    ALTERED = "altered"
    """A stored event differs from its leaf, or the case's trail does not verify."""
    NOT_LOGGED = "not_logged"
    """A stored event is neither a leaf nor waiting for the ledger."""
    CHECKPOINT_INCONSISTENT = "checkpoint_inconsistent"
    """The stored tree's root at a signed (and witnessed) size is not the signed one."""
    TRIGGER_DISABLED = "trigger_disabled"
    """An append-only trigger is switched off."""
    PARTITION_UNGUARDED = "partition_unguarded"
    """A partition of the log lacks its unique key, TRUNCATE trigger or the constraint
    that holds its columns to the signed bytes, or grants a role anything."""
    ERASURE_UNRECORDED = "erasure_unrecorded"
    """A case's values erased without its stored CASE_ERASED, or the other way round."""
    REFUSED_VALID_ACTION = "refused_valid_action"
    """A worker refused a person's action that is signed and keeps the wait's rules."""
    AUDIT_RUN_UNREADABLE = "audit_run_unreadable"
    """The last pass, as signed, cannot be read as a pass (its findings or its size):
    this pass checks the whole log instead of going on from it."""
    AUDIT_RUN_ALTERED = "audit_run_altered"
    """A kept pass is not as the auditor signed it: unsigned, under a key not
    registered, its bytes or columns changed, out of its chain, or removed from the end
    of the chain the auditor remembers (casetrail.audit.audit_runs). When it is the
    last one, this pass checks the whole log."""


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    detail: str
    case_id: uuid.UUID | None = None
    backtest_id: uuid.UUID | None = None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "detail": self.detail,
                **({"caseId": str(self.case_id)} if self.case_id else {}),
                **({"backtestId": str(self.backtest_id)} if self.backtest_id else {})}


@dataclass
class AuditReport:
    full: bool
    from_leaf: int
    to_leaf: int
    cases_checked: int = 0
    cases_expired: int = 0
    """Expired cases in the log, each accounted for by its tombstone and vouched for by
    its signed CASE_EXPIRED (a tombstone with a finding against it is not counted)."""
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    cases_scrubbed: int = 0
    """Stored cases the scrub re-verified (docs/design.md, "One command audits the whole
    log")."""
    scrub_lapped: bool = False
    """The scrub came round to where it began in this pass."""

    @property
    def clean(self) -> bool:
        return not self.findings

    def by_kind(self) -> dict[str, int]:
        counts = {k.value: 0 for k in FindingKind}
        for finding in self.findings:
            counts[finding.kind.value] += 1
        return counts

    def as_json(self) -> dict[str, Any]:
        return {"full": self.full, "fromLeaf": self.from_leaf, "toLeaf": self.to_leaf,
                "casesChecked": self.cases_checked, "casesExpired": self.cases_expired,
                "casesScrubbed": self.cases_scrubbed, "scrubLapped": self.scrub_lapped,
                "clean": self.clean,
                "seconds": round(self.seconds, 3), "byKind": self.by_kind(),
                "findings": [f.as_json() for f in self.findings]}


def _leaf_findings(unmatched: Iterable[Mismatch]) -> list[Finding]:
    gone: dict[uuid.UUID, list[int]] = {}
    changed: dict[uuid.UUID, list[int]] = {}
    for m in unmatched:
        assert m.leaf_index is not None
        (gone if m.stored_hash is None else changed).setdefault(m.case_id, []).append(
            m.leaf_index)
    return [Finding(FindingKind.REMOVED_AFTER_LOGGING, f"{len(leaves)} logged events are no "
                    f"longer stored (leaves {_span(leaves)})", case)
            for case, leaves in gone.items()] + \
        [Finding(FindingKind.ALTERED, f"{len(leaves)} stored events differ from their leaves "
                 f"(leaves {_span(leaves)})", case) for case, leaves in changed.items()]


def _span(leaves: list[int]) -> str:
    shown = ", ".join(str(i) for i in leaves[:5])
    return shown + (f", … {len(leaves) - 5} more" if len(leaves) > 5 else "")


@dataclass(frozen=True)
class WholeLog:
    """The audit over one namespace's database (as the operator)."""

    store: AuditStore
    ledger: LedgerStore
    evidence: Evidence
    auditor: Auditor
    """The auditor's key and where it remembers its last pass."""
    scrub_seconds: float = SCRUB_SECONDS
    """How long a pass's scrub may run (``CASETRAIL_AUDIT_SCRUB_SECONDS``)."""

    async def run(self, *, full: bool = False) -> AuditReport:
        started, began = datetime.now(UTC), time.perf_counter()
        size = await self.store.tree_size()
        runs = await self.store.kept_runs()
        chain = read_chain(runs, {k.key_id: k.public_key for k in
                                  await self.evidence.keys.sibling("audit_keys").all()})
        last, unreadable = self._last_run(chain, size)
        report = AuditReport(full or (last is None and chain.last_id is not None),
                             0 if full or last is None else last.to_leaf, size)
        report.findings += self._runs_found(chain, removed_since(
            remembered(self.auditor.state), runs))
        if unreadable:
            report.findings.append(Finding(FindingKind.AUDIT_RUN_UNREADABLE, unreadable))
        if full:
            last = None
        report.findings += _leaf_findings(await self.store.leaves_unmatched())
        report.findings += [
            Finding(FindingKind.NOT_LOGGED, f"event {m.event_id} is stored but neither in "
                    "the log nor waiting for it", m.case_id)
            for m in await self.store.events_unlogged()]
        report.findings += [
            Finding(FindingKind.ALTERED, "an expired case's tombstone does not account for "
                    "its leaves, or its CASE_EXPIRED is not the one stored", case)
            for case in await self.store.expiries_unaccounted()]
        report.findings += await self._checkpoints(report.from_leaf)
        report.findings += [
            Finding(FindingKind.TRIGGER_DISABLED, f"the append-only trigger {trigger} of "
                    f"{table} is switched off")
            for table, trigger in await self.store.triggers_off()]
        report.findings += [
            Finding(FindingKind.PARTITION_UNGUARDED, f"the log's partition {partition} "
                    f"lacks {', '.join(lacks)}")
            for partition, lacks in await self.store.partitions_unguarded()]
        report.findings += [
            Finding(FindingKind.ERASURE_UNRECORDED, "its sensitive values are erased but its "
                    "trail holds no CASE_ERASED: erased outside the record", case)
            for case in await self.store.erasures_unrecorded()]
        report.findings += await self._backtests(report.from_leaf,
                                                 last.failing_backtests if last else [])
        report.findings += await self._refusals()
        checked = await self._trails(report, last.failing_cases if last else [])
        scrub = await self._scrub(report, last.scrubbed_to if last else None, checked)
        report.cases_scrubbed, report.scrub_lapped = scrub.cases, scrub.lapped
        # An expiry is counted only when nothing is found against it: a tombstone alone,
        # or one its signed CASE_EXPIRED does not vouch for, is a finding, not an expiry.
        report.cases_expired = await self.store.expired_count(
            [f.case_id for f in report.findings if f.case_id])
        report.seconds = time.perf_counter() - began
        await self._keep(chain, report, started, scrub)
        return report

    def _last_run(self, chain: ChainRead, size: int) -> tuple[LastRun | None, str | None]:
        """The last pass to go on from, read from its signed bytes, or why there is none
        to believe (the pass then checks everything)."""
        if chain.last is None:
            return None, None
        body = chain.last
        last = read_run(chain.last_id or 0, body.get("toLeaf"), body.get("findings"), size,
                        body.get("scrubbedTo"))
        return (None, last.unreadable) if last.unreadable else (last, None)

    @staticmethod
    def _runs_found(chain: ChainRead, removed: str | None) -> list[Finding]:
        found = [Finding(FindingKind.AUDIT_RUN_ALTERED, f"audit run {run_id} is not as the "
                         f"auditor signed it: {', '.join(problems)}")
                 for run_id, problems in chain.problems.items()]
        return found + ([Finding(FindingKind.AUDIT_RUN_ALTERED, removed)] if removed else [])

    async def _keep(self, chain: ChainRead, report: AuditReport, started: datetime,
                    scrub: Scrubbed) -> None:
        """Keep the pass, signed and chained after the last kept, and remember it."""
        fields = {
            "startedAt": started.isoformat(), "finishedAt": datetime.now(UTC).isoformat(),
            "fullPass": report.full, "fromLeaf": report.from_leaf, "toLeaf": report.to_leaf,
            "casesChecked": report.cases_checked,
            "findings": [f.as_json() for f in report.findings],
            "scrubbedTo": str(scrub.to) if scrub.to else None,
            "casesScrubbed": scrub.cases, "scrubLapped": scrub.lapped}
        end: tuple[int, str] | None = (chain.next_seq - 1, chain.prev_hash)
        for attempt in range(KEEP_ATTEMPTS):
            seq, prev = (end[0] + 1, end[1]) if end else (0, GENESIS)
            record = seal_run(self.auditor.signer, seq, prev, fields)
            try:
                await self.store.keep_run(fields, seq, record.body, record.integrity)
            except ChainMoved:
                if attempt + 1 == KEEP_ATTEMPTS:
                    raise
                end = await self.store.chain_end()  # another auditor kept one first
                continue
            remember(self.auditor.state, record)
            return

    async def _backtests(self, from_leaf: int, failing: list[uuid.UUID]) -> list[Finding]:
        """Backtest records (docs/backtests.md, "The record"): each a leaf of the log as
        stored (every record, every pass); and, for the records logged since the last
        pass and those that failed it (every one in a full pass), the chain unbroken,
        each signed by a registered key, each result the one its record names."""
        found = []
        for m in await self.store.backtests_unmatched():
            if m.leaf_index is None:
                found.append(Finding(FindingKind.NOT_LOGGED, f"backtest {m.event_id}'s "
                                     "record is neither in the log nor waiting for it",
                                     backtest_id=m.event_id))
            elif m.stored_hash is None:
                found.append(Finding(FindingKind.REMOVED_AFTER_LOGGING, "the log holds "
                                     f"backtest {m.event_id}'s record (leaf {m.leaf_index}) "
                                     "but it is no longer stored", backtest_id=m.event_id))
            else:
                found.append(Finding(FindingKind.ALTERED, f"backtest {m.event_id}'s record "
                                     f"differs from its leaf {m.leaf_index}",
                                     backtest_id=m.event_id))
        keys = {k.key_id: k.public_key for k in await self.evidence.keys.all()}
        backtests = BacktestStore(self.store.pool)
        for record in await self.store.backtest_records(from_leaf, failing):
            problems = record_problems(record, record["before"] or GENESIS, keys,
                                       await backtests.results(record["backtest_id"]))
            if problems:
                found.append(Finding(FindingKind.ALTERED, f"backtest {record['backtest_id']}'s "
                                     f"record does not verify: {', '.join(problems)}",
                                     backtest_id=record["backtest_id"]))
        return found

    async def _refusals(self) -> list[Finding]:
        """Every action a worker refused, judged again by the worker's own rule
        (casetrail.audit.kept_actions) against the record as it stood then: a refusal of
        a signed action that keeps the wait's rules is a finding (every pass: refusals
        are rare, each one an attack or a bug)."""
        found = []
        _, actions = await self.evidence.keys.with_action_keys()
        keys = {k.key_id: k for k in actions}
        cases = self.evidence.store
        for refused in await self.store.refusals():
            agent, action = AGENTS.get(refused.agent), refused.action
            record, _ = await record_so_far(cases, self.evidence.keys, refused.case_id,
                                            action.parked_attempt + 1, {}, 0)
            parked = None if record is None else record.parked
            if agent is None or record is None or parked is None \
                    or parked.attempt != action.parked_attempt:
                continue  # no such wait in the record: nothing it could have decided
            acting = acting_identity(action)
            persons = await cases.persons([*record.reviewers, *acting])
            if kept_action_refusal(
                    refused.case_id, refused.tenant_id, agent, parked, action, keys,
                    starter=await cases.person_of(refused.started_by),
                    reviewers=tuple(persons[:len(record.reviewers)]),
                    person=persons[len(record.reviewers)] if acting else None) is None:
                found.append(Finding(FindingKind.REFUSED_VALID_ACTION, (
                    f"a worker refused a signed {action.kind} (attempt "
                    f"{action.parked_attempt}) that keeps the wait's rules, saying "
                    f"{refused.why_code}: {refused.why}"), refused.case_id))
        return found

    async def _checkpoints(self, since: int) -> list[Finding]:
        found = []
        for size, root in await self.store.witnessed_sizes(since):
            if await self.ledger.root(size) != root:
                found.append(Finding(FindingKind.CHECKPOINT_INCONSISTENT, (
                    f"the stored tree's root at {size} leaves is not the one its checkpoint "
                    "signed: the tree changed under a signed (or witnessed) size")))
        return found

    async def _trails(self, report: AuditReport, failing: list[uuid.UUID]
                      ) -> set[uuid.UUID]:
        """Verify every case logged since the last pass, and those that failed it; the
        cases verified."""
        already = {(f.kind, f.case_id) for f in report.findings}
        cases = dict.fromkeys([*failing, *await self.store.cases_logged_from(
            report.from_leaf)])
        report.findings += [
            Finding(FindingKind.ERASURE_UNRECORDED, "its trail records CASE_ERASED but its "
                    "sensitive values are kept (a legal hold came first?)", case)
            for case in await self.store.erasures_unapplied(list(cases))]
        for case_id in cases:
            await self._trail(report, case_id, already)
            report.cases_checked += 1
        return set(cases)

    async def _trail(self, report: AuditReport, case_id: uuid.UUID,
                     already: set[tuple[FindingKind, uuid.UUID | None]]) -> None:
        """One case's trail verified (chain, signatures, columns against the signed
        bytes, the row against the trail, its leaves): a finding unless it verifies."""
        verdict = await self.evidence.verify(case_id)
        if verdict is None or verdict.verified:
            return
        codes = sorted({p.code for p in verdict.problems})
        kind = FindingKind.REMOVED_AFTER_LOGGING if codes == ["removed_after_logging"] \
            else FindingKind.ALTERED
        if (kind, case_id) not in already:
            already.add((kind, case_id))
            report.findings.append(Finding(kind, "the trail does not verify: " +
                                           ", ".join(codes), case_id))

    async def _scrub(self, report: AuditReport, start: uuid.UUID | None,
                     checked: set[uuid.UUID]) -> Scrubbed:
        """Re-verify stored cases in case-id order, going on after ``start`` (where the
        last pass's scrub stopped) for at most ``scrub_seconds``, and at most once round:
        an edit no other check sees (a payload rewritten with its hash kept and the
        constraint put back) is found within the time a lap takes. Cases this pass
        already verified are passed over; a full pass verified all of them."""
        scrub = Scrubbed(start)
        if report.full or self.scrub_seconds <= 0:
            return scrub
        already = {(f.kind, f.case_id) for f in report.findings}
        deadline, wrapped = time.perf_counter() + self.scrub_seconds, False
        while time.perf_counter() < deadline:
            fetched = await self.store.cases_after(scrub.to, SCRUB_BATCH)
            batch = [c for c in fetched if not wrapped or start is None or c < start]
            for case_id in batch:
                if time.perf_counter() >= deadline:
                    return scrub
                if case_id not in checked:
                    await self._trail(report, case_id, already)
                scrub.to, scrub.cases = case_id, scrub.cases + 1
            if len(batch) < len(fetched) or (not fetched and (wrapped or start is None)):
                scrub.lapped = True  # came round to where it began
                scrub.to = scrub.to if len(batch) < len(fetched) else None
                return scrub
            if not fetched:
                wrapped, scrub.to = True, None
        return scrub


async def audit_namespace(settings: Settings, *, full: bool = False) -> AuditReport:
    """One pass over the namespace's database as the auditor's own role (never the
    bootstrap URL); its metrics set."""
    auditor = Auditor.of(settings)
    pool = await create_pool(settings.audit_database_url(), max_size=2)
    try:
        await auditor.registered(KeyRegistry(pool, "audit_keys"))
        ledger = LedgerStore(pool)
        audit = WholeLog(AuditStore(pool), ledger,
                         Evidence(CaseStore(pool), KeyRegistry(pool), ledger), auditor,
                         settings.audit_scrub_seconds)
        report = await audit.run(full=full)
    finally:
        await pool.close()
    for kind, count in report.by_kind().items():
        metrics.AUDIT_FINDINGS.labels(kind).set(count)
    metrics.AUDIT_CASES_CHECKED.inc(report.cases_checked)
    metrics.AUDIT_CASES_SCRUBBED.inc(report.cases_scrubbed)
    metrics.AUDIT_CASES_EXPIRED.set(report.cases_expired)
    metrics.AUDIT_PASSES.labels("clean" if report.clean else "findings").inc()
    return report
