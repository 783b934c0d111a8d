"""The case worker: takes start commands off ``<ns>.case-start`` and runs the ReAct loop.

- Manual ack, only after the case's terminal event is confirmed by the broker and
  its end noted in Postgres. Up to ``concurrency`` cases at work at once (a slot
  each); a case gives its slot back as soon as its outcome is decided, so the next
  case starts while the last one's end is still being confirmed and noted. The
  channel's prefetch is a quarter above ``concurrency``, so that next start
  command is already here (``prefetch_for``).
- Before running, the worker *claims* the case in Postgres (a lease it renews
  while the case runs). The claim decides what a start command means: a
  first run, the next attempt after a dead worker, a redelivery beside a live
  attempt (wait, do not start a twin), a case already ended (ack), or a case
  cancelled while queued (``CASE_CANCELLED`` without running).
- A start command only names a case: the worker runs what the case's row says
  (input, model, limits re-checked against this worker's caps), and takes start
  commands from the API's broker user alone (anything else is dead-lettered).
- Cancel requests arrive on the ``<ns>.cancel`` fanout; each worker binds its
  own exclusive queue and stops the case if it runs it, once Postgres confirms
  the case was asked to stop (a broadcast alone decides nothing).
- A case whose answer a person decides ends its attempt with ``CASE_AWAITING_REVIEW``;
  the worker notes it parked and acks its start command: it holds no slot, no memory
  and no unacked message while it waits. The API records what a person did (a review,
  or a cancel) and sends a start command again; the claim finds the action, and the
  next attempt records it and goes on from the record. A start command that finds the
  case still waiting is acked and nothing runs (``parked``).
- On shutdown it stops taking work, gives running cases a grace period, then
  abandons the rest: their leases are released and their start commands go
  back to the queue, to run as the next attempt elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from casetrail.adapters.bus.connection import BusConnection
from casetrail.adapters.bus.dead_letter import dead_letter
from casetrail.adapters.bus.deliveries import Delivery, Subscription, TaskPerDelivery
from casetrail.adapters.bus.probe import QueueProbe
from casetrail.adapters.bus.publisher import Publisher, event_emitter
from casetrail.adapters.bus.rpc import BusWorkerRuntime, RetryPolicy
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import (
    CapabilityKeyRegistry,
    CaseSecrets,
    CaseStore,
    Claim,
    KeyRegistry,
    ParkedAction,
    RecordedCase,
    Wait,
)
from casetrail.adapters.store.batching import Coalescer
from casetrail.adapters.store.pool import DatabaseError
from casetrail.agents import AGENTS, CAPABILITIES
from casetrail.agents.profile import AgentProfile
from casetrail.audit.kept_actions import acting_identity, kept_action_refusal
from casetrail.audit.resume import record_so_far
from casetrail.cases.configured import described, misconfigured
from casetrail.components.duties import Duties, Duty, Host
from casetrail.components.runtime import component
from casetrail.components.supervisor import run_until_signal
from casetrail.components.worker_duties import worker_duties
from casetrail.config import ReviewPolicy, Settings, get_settings
from casetrail.contract.commands import (
    CancelCommand,
    CaseStartCommand,
    EraseCommand,
    InvalidCommand,
)
from casetrail.contract.dead_letters import DeadLetterCode
from casetrail.contract.events import (
    EXPIRED_EVENT_TYPE,
    MAX_EVENT_BYTES,
    PARKING_EVENT_TYPE,
    TERMINAL_EVENT_TYPES,
    CaseAwaitingReview,
    CaseErasedPayload,
    CaseReviewedPayload,
    Limits,
    ModelRef,
    cancelled_while_queued,
    describe_validation_error,
    make_event,
)
from casetrail.contract.integrity import Signer
from casetrail.engine.case import CancelSignal, CaseSpec, GivenAnswer, Parked
from casetrail.engine.chat import ChatModel
from casetrail.engine.loop import ReactEngine
from casetrail.engine.tools import (
    ToolBox,
    WorkerCallResult,
    WorkerRuntime,
    a2a_capability,
    mcp_capability,
)
from casetrail.errors import (
    CasetrailError,
    PermanentError,
    Reject,
    StoreUnavailable,
    TransientError,
)
from casetrail.mcp import CATALOG_SECONDS, STARTUP_READ_SECONDS, Catalogs
from casetrail.privacy.sealing import CapabilityKeys
from casetrail.privacy.sensitive import Redaction, Vault, restore
from casetrail.providers import ModelFactory
from casetrail.telemetry import logs, metrics, tracing
from casetrail.telemetry.observer import TELEMETRY
from casetrail.trail.keyfile import worker_signer
from casetrail.trail.person_actions import (
    SignedAction,
    erase_refusal,
    start_refusal,
    wait_kind,
)
from casetrail.trail.verification import PublicKey

log = logging.getLogger("casetrail.worker")

RECORD_PATIENCE_SECONDS = 30.0
"""How long a case a person acted on waits for the consumer to store the attempt that
waited, before it is handed back to come again."""

ACTION_KEYS_SECONDS = 60.0
"""How long the worker's copy of the registered action keys is used before it is read
again (sooner when an action names a key the copy lacks)."""



@dataclass(frozen=True)
class _SealingRuntime:
    """The bus runtime for one case with sensitive values: each call hands over the
    case's redaction, so the values travel as placeholders and sealed."""

    runtime: BusWorkerRuntime
    redaction: Redaction

    async def execute(self, capability: str, args: Mapping[str, Any], *, call_id: str,
                      retry: bool = True) -> WorkerCallResult:
        return await self.runtime.execute(capability, args, call_id=call_id, retry=retry,
                                          redaction=self.redaction)

@dataclass(frozen=True)
class Caps:
    """What this worker allows a case, whatever its row says (the API checked the same
    on the way in; a row edited since, or caps lowered since, meets them here)."""

    max_cycles: int = 50
    max_deadline_seconds: float = 600.0
    bench_mode: bool = False
    max_event_bytes: int = MAX_EVENT_BYTES

    @classmethod
    def from_settings(cls, settings: Settings) -> Caps:
        return cls(settings.max_cycles_cap, settings.max_deadline_seconds, settings.bench_mode,
                   settings.max_event_bytes)

    def vet(self, case_id: uuid.UUID, case: RecordedCase) -> tuple[Limits, ModelRef]:
        """The case's limits and model, held to the caps."""
        try:
            limits = Limits.model_validate(case.limits)
            model = ModelRef.model_validate(case.model)
        except ValidationError as exc:
            raise Reject(f"case {case_id} has an unreadable row: "
                         f"{describe_validation_error(exc)}") from None
        held = limits.model_copy(update={
            "max_cycles": min(limits.max_cycles, self.max_cycles),
            "deadline_seconds": min(limits.deadline_seconds, self.max_deadline_seconds)})
        if model.latency_ms is not None and not self.bench_mode:
            model = model.model_copy(update={"latency_ms": None})
        if held != limits or model.latency_ms != case.model.get("latencyMs"):
            log.warning("case %s asked for more than this worker allows; held to %s, %s",
                        case_id, held, model)
        return held, model


def prefetch_for(concurrency: int) -> int:
    """Start commands a worker holds: its slots, and a quarter more waiting for one.

    A case's last steps (its terminal event's confirm, its end noted in Postgres, the
    ack) take tens of milliseconds after its slot is free; without start commands in
    hand the slot would wait for the ack and the broker's next delivery. A quarter
    covers the cases finishing at once at hundreds of cases a second, and holds back
    from other workers no more than that (bench/models.py, docs/benchmarks.md)."""
    return concurrency + max(1, concurrency // 4)


@dataclass
class LiveCase:
    """A case this process holds: how to stop it, and when it has finished here."""

    signal: CancelSignal = field(default_factory=CancelSignal)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    slot: bool = False
    """Whether the case holds one of the worker's slots."""


@dataclass
class CaseWorker:
    """Runs cases from start commands."""

    connection: BusConnection
    store: CaseStore
    topology: Topology
    runtime: WorkerRuntime
    signer: Signer
    api_user: str
    """The broker user whose start commands and cancels this worker takes."""
    secrets: CaseSecrets
    keys: KeyRegistry
    """The registered signing keys: a resumed attempt checks the record it resumes."""
    action_keys: KeyRegistry = field(init=False)
    """The registered action keys: a person's action is recorded only when one signed
    it."""
    _action_key_copy: tuple[float, dict[str, PublicKey]] | None = field(default=None,
                                                                       init=False)
    caps: Caps = field(default_factory=lambda: Caps.from_settings(get_settings()))
    models: Callable[[ModelRef, AgentProfile], ChatModel] = field(
        default_factory=lambda: ModelFactory(get_settings())
    )
    concurrency: int = 256
    lease_seconds: float = 15.0
    publish_retry_seconds: float = 60.0
    """How long an event's publish is tried again before the case is handed back."""
    duties: Duties = ()
    """What this worker hosts beside its cases (service/components/duties.py), each made
    when the worker starts; ``hosted`` holds them by name while it runs."""
    hosted: dict[str, Duty] = field(default_factory=dict, init=False)
    sweep_seconds: float = 10.0
    """How often this worker counts the reviews waiting (the review gauges)."""
    shutdown_grace: float = 10.0
    review_policy: Callable[[str], ReviewPolicy] = lambda tenant: ReviewPolicy()
    """What a tenant asks of the people deciding its cases (its policy, in the settings)."""
    review_deadline_seconds: float = 86_400.0
    """How long a review may take before it is overdue, unless the agent or tenant says."""
    owner: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    )
    _live: dict[uuid.UUID, LiveCase] = field(default_factory=dict)
    _stopping: bool = False
    _checks: set[asyncio.Task[None]] = field(default_factory=set)
    # Claims and end notes of cases starting or ending together go to Postgres as
    # one statement each (a burst of start commands is one round trip, not 1,000).
    _claims: Coalescer[uuid.UUID, Claim] = field(init=False)
    _ended: Coalescer[uuid.UUID, None] = field(init=False)
    _slots: asyncio.Semaphore = field(init=False)
    catalog_seconds: float = CATALOG_SECONDS
    """How often the MCP servers' catalogs are read again (CASETRAIL_MCP_CATALOG_SECONDS)."""
    unconfigured: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Agents that cannot run as configured, with the reasons (their cases are refused)."""
    catalogs: Catalogs = field(init=False)
    """The MCP servers' catalogs, read through ``runtime`` when a case needs one."""

    @property
    def live_cases(self) -> Mapping[uuid.UUID, LiveCase]:
        return self._live

    @property
    def slots_busy(self) -> int:
        """Slots held by a case at work (the rest of ``live_cases`` wait for one, or
        are finishing: their outcome decided, their end being confirmed)."""
        return sum(1 for live in self._live.values() if live.slot)

    def __post_init__(self) -> None:
        self.action_keys = self.keys.sibling("action_keys")
        self._claims = Coalescer(
            lambda ids: self.store.claim_many(ids, self.owner, self.lease_seconds)
        )
        self._ended = Coalescer(self._mark_terminal_published)
        self._slots = asyncio.Semaphore(self.concurrency)
        self.catalogs = Catalogs(self.runtime, self.catalog_seconds)

    async def _take_slot(self, live: LiveCase) -> None:
        await self._slots.acquire()
        live.slot = True

    def _free_slot(self, live: LiveCase) -> None:
        if live.slot:
            live.slot = False
            self._slots.release()

    async def _mark_terminal_published(self, case_ids: Sequence[uuid.UUID]
                                       ) -> dict[uuid.UUID, None]:
        await self.store.mark_terminal_published(*case_ids)
        return dict.fromkeys(case_ids)

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=prefetch_for(self.concurrency))
        await self.topology.require(channel)
        publisher = self._publisher = await Publisher.open(
            self.connection, retry_seconds=self.publish_retry_seconds)
        self._sink = event_emitter(publisher, self.topology, self.signer,
                                   self.caps.max_event_bytes)
        self._engine = ReactEngine(self._sink, self._sink.redact, TELEMETRY)
        cancel_exchange = await channel.get_exchange(self.topology.cancel_exchange, ensure=False)
        cancel_queue = await channel.declare_queue(
            f"{self.topology.namespace}.cancel.{uuid.uuid4().hex}", exclusive=True,
            auto_delete=True,
        )
        await cancel_queue.bind(cancel_exchange)
        cancels = Subscription(channel, cancel_queue.name, self._on_cancel, no_ack=True)
        await cancels.start()
        await self.catalogs.settled(STARTUP_READ_SECONDS)  # then the first cases find them
        running = TaskPerDelivery(self._handle_start, publisher, self.topology)
        starts = Subscription(channel, self.topology.case_start_queue, running)
        await starts.start()
        renewer = asyncio.create_task(self._renew_leases())
        counting = asyncio.create_task(self._count_reviews())
        host = Host(self.owner, self.connection, publisher, self.topology, self.store,
                    self.secrets, self.keys, self.signer, self._sink.append,
                    lambda: self._action_keys_for(None), self.models, self.runtime,
                    self.lease_seconds)
        self.hosted = {name: make(host) for name, make in self.duties}
        hosting = [asyncio.create_task(duty.run()) for duty in self.hosted.values()]
        log.info("worker %s taking cases from %s", self.owner, self.topology.case_start_queue)
        if ready is not None:
            ready.set()
        await stop.wait()
        self._stopping = True
        await starts.cancel()
        await cancels.cancel()
        await running.drain(self.shutdown_grace)
        renewer.cancel()
        counting.cancel()
        for duty in hosting:
            duty.cancel()
        await publisher.channel.close()
        await channel.close()

    def _on_cancel(self, message: Delivery) -> None:
        if message.user_id != self.api_user:
            self._spawn(dead_letter(self._publisher, self.topology, message,
                                    f"cancel from broker user {message.user_id!r}, not the "
                                    f"API's ({self.api_user!r})", DeadLetterCode.FOREIGN_SENDER))
            return
        try:
            command: CancelCommand = CancelCommand.from_json(message.body)
        except InvalidCommand as exc:
            log.warning("unreadable cancel command ignored: %s", exc)
            return
        if command.case_id in self._live:
            self._spawn(self._cancel_if_requested(command.case_id))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _cancel_if_requested(self, case_id: uuid.UUID) -> None:
        """Stop a live case once Postgres agrees it was asked to stop (with the reason
        and the canceller it recorded, not the broadcast's)."""
        try:
            requested = await self.store.cancel_request(case_id)
        except StoreUnavailable as exc:
            # The claim and every lease renewal read the request too: the case stops
            # at the latest when the lease is next renewed... unless the store stays
            # down, in which case the case cannot finish anyway.
            log.warning("cannot confirm the cancel of %s: %s", case_id, exc)
            return
        live = self._live.get(case_id)
        if requested is None:
            log.warning("cancel broadcast for %s ignored: Postgres has no request", case_id)
        elif live is not None:
            log.info("cancelling case %s", case_id)
            live.signal.cancel(*requested)

    async def _renew_leases(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.store.renew_leases(list(self._live), self.owner, self.lease_seconds)
            except (StoreUnavailable, DatabaseError) as exc:
                # Never let the renewer die: without it every live case's lease lapses.
                log.warning("could not renew leases: %s", exc)

    async def _handle_start(self, message: Delivery) -> None:
        """Run the case a start command names. Returning acks the command; ``Reject``
        dead-letters it; a ``TransientError`` (or cancellation) hands it back.

        A start command is acked only once its case has ended (here or elsewhere, as
        the claim shows): never while it runs, and never because a copy of it was
        here when the case was handed back."""
        # Start commands come from the API, and from a worker's sweeper re-sending a
        # stranded case's (the command only names a case: the row says what runs).
        if message.user_id != self.api_user and (
                message.type == EraseCommand.MESSAGE_TYPE
                or message.user_id != self._publisher.user_id):
            raise Reject(f"start command from broker user {message.user_id!r}, not the "
                         f"API's ({self.api_user!r})", DeadLetterCode.FOREIGN_SENDER)
        if message.type == EraseCommand.MESSAGE_TYPE:
            await self._record_erasure(message)
            return
        try:
            command: CaseStartCommand = CaseStartCommand.from_json(message.body)
        except InvalidCommand as exc:
            raise Reject(f"unreadable start command: {exc}", DeadLetterCode.UNREADABLE) from exc
        with logs.bound(case_id=str(command.case_id)):  # on every line about the case
            await self._start(command, message)

    async def _start(self, command: CaseStartCommand, message: Delivery) -> None:
        """``_handle_start`` for a readable command."""
        while (running := self._live.get(command.case_id)) is not None:
            # The broker redelivered the start command of a case this process is
            # still running (its channel was lost: a broker restart, a node's loss).
            # Never a second attempt beside the live one: wait for it to finish here,
            # then let the claim decide. It ended: ack. It was handed back (its
            # publishes refused, its channel gone, so the original cannot be nacked):
            # this copy is what gives the case its next attempt.
            await running.finished.wait()
        # Registered before the claim, so a cancel broadcast that arrives while the
        # case is being claimed is not missed.
        live = self._live[command.case_id] = LiveCase()
        try:
            await self._take_slot(live)
            with tracing.continued(message.headers):  # the trace POST /cases began
                done = await self._claim_and_run(command, live)
        except asyncio.CancelledError:
            # Shutdown abandoned this case: hand it back for the next attempt.
            await self._release(command.case_id)
            raise
        except Reject:
            await self._release(command.case_id)
            raise
        except CasetrailError as exc:
            log.error("case %s could not finish here (%s); handing it back", command.case_id,
                      exc)
            await self._release(command.case_id)
            raise TransientError(f"case {command.case_id} handed back: {exc}") from exc
        finally:
            self._free_slot(live)
            del self._live[command.case_id]
            live.finished.set()
        if not done:
            raise TransientError(f"worker stopping before case {command.case_id} ran")

    async def _claim_and_run(self, command: CaseStartCommand, live: LiveCase) -> bool:
        """True when the case has reached its terminal event (ack the command)."""
        signal = live.signal
        while not self._stopping:
            try:
                claim = await self._claims(command.case_id)
            except StoreUnavailable as exc:
                log.warning("cannot claim %s yet: %s", command.case_id, exc)
                await asyncio.sleep(1.0)
                continue
            match claim.outcome:
                case "ended" | "parked":
                    return True
                case "unknown":
                    log.error("start command for unknown case %s dropped", command.case_id)
                    return True
                case "busy":
                    # Redelivered beside a live attempt elsewhere (broker restart): never
                    # start a twin; wait until it ends or its lease lapses, holding the
                    # command (unacked: it is the successor of an attempt that dies) but
                    # not a slot.
                    self._free_slot(live)
                    await asyncio.sleep(self.lease_seconds / 2)
                    await self._take_slot(live)
                    continue
                case "cancel_queued":
                    assert claim.case is not None
                    await self._started_by_the_api(command.case_id, claim.case)
                    for event in cancelled_while_queued(command.case_id, claim.cancel_reason,
                                                        claim.cancelled_by, claim.case.tenant_id):
                        await self._sink.emit(event)
                    await self._mark_ended(command.case_id)
                    return True
                case "run":
                    if claim.cancel_reason is not None and not signal.is_set:
                        signal.cancel(claim.cancel_reason, claim.cancelled_by)
                    assert claim.case is not None
                    await self._run(command.case_id, claim, live)
                    return True
        return False

    async def _run(self, case_id: uuid.UUID, claim: Claim, live: LiveCase) -> None:
        case, attempt, restart_reason = claim.case, claim.attempt, claim.restart_reason
        assert case is not None
        await self._started_by_the_api(case_id, case)  # before anything reads the row
        agent = AGENTS.get(case.agent)
        if agent is None:
            raise Reject(f"case {case_id} names an agent this worker does not have: "
                         f"{case.agent!r}")
        if problems := self.unconfigured.get(agent.name):
            raise Reject(f"case {case_id}: {described(agent.name, problems)}")
        limits, model = self.caps.vet(case_id, case)
        # The row holds placeholders for the sensitive values: the case runs on the
        # values themselves, and every event it emits has them replaced again.
        values = {} if case.sealed is None else self.secrets.vault.open(case_id, case.sealed)
        resumption, deadline_at, review, given = None, None, None, None
        if claim.action is not None:
            await self._stored_before_acting(case_id, claim.action.parked_attempt)
        if attempt > 1:
            resumption, deadline_at = await record_so_far(
                self.store, self.keys, case_id, attempt, values, limits.deadline_seconds)
        parked = None if resumption is None else resumption.parked
        reviewers = () if resumption is None else resumption.reviewers
        if parked is not None and parked.review is None:
            went_on = await self._after_wait(case_id, claim, case, agent, parked, reviewers,
                                             live)
            if went_on is None:
                return
            review, given, restart_reason = went_on
        policy = self.review_policy(case.tenant_id)
        spec = CaseSpec(
            case_id=case_id, attempt=attempt, agent=agent.name,
            system_prompt=agent.system_prompt, input=restore(case.input, values),
            limits=limits,
            model=model, restart_reason=restart_reason,
            context_budget=agent.context_budget_tokens, agent_version=agent.version,
            tenant_id=case.tenant_id, started_by=case.started_by,
            resumption=resumption, deadline_at=deadline_at, answering=agent.answering,
            agent_digest=agent.digest, review=review, given=given,
            asks_people=agent.asks_people,
            review_every_case=policy.every_case,
            max_event_bytes=self.caps.max_event_bytes,
            start_action=None if case.start_action is None else case.start_action.as_json(),
            override_reviewers=policy.override_reviewers,
        )
        redaction = Redaction.of(values) if values else None
        # A tool call of this case sends its sensitive values sealed to the capability,
        # never in clear (service/privacy/sealing.py).
        runtime: WorkerRuntime = self.runtime
        if redaction is not None and isinstance(runtime, BusWorkerRuntime):
            runtime = _SealingRuntime(runtime, redaction)
        offered, catalogs = await self.catalogs.offer(agent.tools)
        tools = ToolBox(offered, runtime, TELEMETRY, catalogs)
        # However the attempt stops (ended, parked, handed back), its chain is let go.
        with self._sink.attempt(case_id, attempt, redaction), \
                logs.bound(tenant=case.tenant_id, attempt=attempt):
            ended = await self._engine.run(spec, self.models(model, agent), tools, live.signal,
                                           decided=lambda: self._free_slot(live))
        if isinstance(ended, CaseAwaitingReview):
            due = self._review_due(agent, case.tenant_id, ended.occurred_at)
            waiting = ended.payload
            asked = None if waiting.question is None else waiting.question.call_id
            so_far = (*reviewers, *(() if review is None else (
                (review.reviewer.via, review.reviewer.subject),)))
            await self._note(lambda: self._mark_parked(
                case_id, case, attempt, asked, waiting.review_reasons, so_far, due))
        else:
            await self._mark_ended(case_id)

    async def _started_by_the_api(self, case_id: uuid.UUID, case: RecordedCase) -> None:
        """A case runs only when its row is the one the API signed (an action key's
        signature over its tenant, agent, starter and input): a row written with a
        component's database password alone is refused, never run and never signed,
        and set aside (its start command dead-lettered, the sweeper told it ended)."""
        if case.legacy_start:
            return
        keys = await self._action_keys_for(case.start_action)
        refusal = start_refusal(case.start_action, keys, case_id=case_id,
                                tenant_id=case.tenant_id, agent=case.agent,
                                started_by=case.started_by, case_input=case.input)
        if refusal is None:
            return
        log.error("case %s is refused: %s (%s); it never runs", case_id, refusal.message,
                  refusal.code)
        metrics.PERSON_ACTIONS_REFUSED.labels(f"start_{refusal.code}").inc()
        await self._mark_ended(case_id)
        raise Reject(f"case {case_id}: {refusal.message}", DeadLetterCode.FORGED_START)

    async def _action_keys_for(self, action: SignedAction | None) -> dict[str, PublicKey]:
        """The registered action keys, read again when ``action`` names one not known
        here or the copy is over a minute old (a retirement is seen within a minute)."""
        now = time.monotonic()
        known = self._action_key_copy
        if known is None or now - known[0] > ACTION_KEYS_SECONDS or (
                action is not None and action.key_id not in known[1]):
            known = self._action_key_copy = (
                now, {k.key_id: k for k in await self.action_keys.all()})
        return known[1]

    async def _after_wait(self, case_id: uuid.UUID, claim: Claim, case: RecordedCase,
                          agent: AgentProfile, parked: Parked,
                          reviewers: tuple[tuple[str, str], ...], live: LiveCase
                          ) -> tuple[CaseReviewedPayload | None, GivenAnswer | None,
                                     str | None] | None:
        """A case waiting for a person goes on only with what one did about this wait,
        or a cancel (a review taken before the cancel is recorded first): the review or
        answer to record and why the attempt runs; ``None`` when it still waits (noted
        again). An action the worker cannot check is refused, and the wait re-opens."""
        review, given, restart_reason = None, None, claim.restart_reason
        action = claim.action if claim.action is not None \
            and claim.action.parked_attempt == parked.attempt else None
        if action is not None and not await self._acceptable(case_id, case, agent, parked,
                                                             reviewers, action):
            action = None
        cancelled = claim.cancel_reason is not None or (
            action is not None and action.kind == "cancel")
        if action is not None and action.kind == "review" and parked.question is None:
            review, restart_reason = _recorded_review(action), "review"
        if action is not None and action.kind == "answer" and parked.question is not None:
            given, restart_reason = _given_answer(action), "answer"
        if cancelled:
            restart_reason = "cancel" if review is None else restart_reason
            if not live.signal.is_set:
                live.signal.cancel(claim.cancel_reason, claim.cancelled_by)
        elif review is None and given is None:
            log.info("case %s still waits for a person (attempt %d)", case_id, parked.attempt)
            due = self._review_due(agent, case.tenant_id, parked.asked_at)
            asked = None if parked.question is None else parked.question.call_id
            await self._note(lambda: self._mark_parked(
                case_id, case, parked.attempt, asked, parked.reasons, reviewers, due))
            return None
        return review, given, restart_reason

    async def _mark_parked(self, case_id: uuid.UUID, case: RecordedCase, attempt: int,
                           asked: str | None, reasons: Sequence[str],
                           reviewers: Sequence[tuple[str, str]], due: datetime) -> None:
        """Note the wait beside the parked attempt: what it waits for, and the persons
        it excludes (the starter; on a second review, whoever reviewed the case), each
        as four eyes compares persons (identities an operator linked are one)."""
        kind = wait_kind(asked, reasons)
        starter = await self.store.person_of(case.started_by)
        excludes = {*(() if starter is None else (starter,)),
                    *(await self.store.persons(reviewers) if kind == "second_review"
                      else ())}
        await self.store.mark_parked(case_id, Wait(attempt, kind, asked,
                                                   tuple(sorted(excludes))), due)

    async def _acceptable(self, case_id: uuid.UUID, case: RecordedCase, agent: AgentProfile,
                          parked: Parked, reviewers: tuple[tuple[str, str], ...],
                          action: ParkedAction) -> bool:
        """Whether the kept ``action`` may be recorded: signed by a registered action
        key, for the wait this worker's trail records, four eyes kept, an override
        within the answer schema. Otherwise it is moved out of the wait's way (kept in
        ``case_actions_refused``), logged and counted, and the case waits again."""
        keys = await self._action_keys_for(action.signed)
        acting = acting_identity(action)
        persons = await self.store.persons([*reviewers, *acting])
        refusal = kept_action_refusal(
            case_id, case.tenant_id, agent, parked, action, keys,
            starter=await self.store.person_of(case.started_by),
            reviewers=tuple(persons[:len(reviewers)]),
            person=persons[len(reviewers)] if acting else None)
        if refusal is None:
            return True
        log.error("case %s: the %s kept for its wait (attempt %d) is refused (%s: %s); it "
                  "is kept in case_actions_refused and the case waits for a person again",
                  case_id, action.kind, parked.attempt, refusal.code, refusal.message)
        metrics.PERSON_ACTIONS_REFUSED.labels(refusal.code).inc()
        await self.store.refuse_action(case_id, parked.attempt, refusal.message, refusal.code)
        return False

    async def _record_erasure(self, message: Delivery) -> None:
        """Append the signed CASE_ERASED after the case's last event, for the erasure the
        API signed; the database shreds the values when it stores that event (never
        before: no component erases values itself)."""
        try:
            command: EraseCommand = EraseCommand.from_json(message.body)
        except InvalidCommand as exc:
            raise Reject(f"unreadable erase command: {exc}", DeadLetterCode.UNREADABLE) from exc
        head = await self.store.trail_head(command.case_id)
        if head is not None and head.event_type == EXPIRED_EVENT_TYPE:
            return  # expired meanwhile: nothing of it is kept to record the erasure on
        if head is None or (head.event_type not in TERMINAL_EVENT_TYPES and not head.erased):
            raise TransientError(f"case {command.case_id}'s terminal event is not stored yet")
        if head.erased:
            return
        signed = None if command.action is None else SignedAction(
            command.action.signed, command.action.key_id, command.action.sig)
        # The tenant is the trail's own, never the command's word.
        refusal = erase_refusal(signed, await self._action_keys_for(signed),
                                case_id=command.case_id, tenant_id=head.tenant_id)
        if refusal is not None:
            metrics.PERSON_ACTIONS_REFUSED.labels(refusal.code).inc()
            raise Reject(f"erase command for case {command.case_id} refused: "
                         f"{refusal.message}", DeadLetterCode.FORGED_ERASE)
        assert signed is not None  # erase_refusal refuses a command without one
        state = await self.secrets.state(command.case_id)
        if state is None or state.erased_at is not None:
            return  # nothing sensitive, or erased already
        if await self.secrets.held(command.case_id, head.tenant_id):
            log.warning("case %s: an erasure was asked for while a legal hold keeps it; "
                        "nothing is erased", command.case_id)
            return
        event = make_event(command.case_id, head.attempt, head.seq + 1, CaseErasedPayload(
            erased_by=signed.signed["by"], erased_at=signed.signed["actedAt"],
            placeholders=state.placeholders, action=command.action), tenant_id=head.tenant_id)
        await self._sink.append(event, head.hash)
        log.info("case %s: erasure recorded", command.case_id)

    async def _stored_before_acting(self, case_id: uuid.UUID, parked_attempt: int) -> None:
        """A wait is noted once its ``CASE_AWAITING_REVIEW`` is confirmed on the bus, so a
        person may act before the consumer has stored it; the next attempt resumes from
        the stored record, which must then hold the whole attempt that waited (else it
        would run again from fewer cycles and wait a second time, the person's action
        left behind). Waits, within ``RECORD_PATIENCE_SECONDS``, for that event; then
        hands the case back (``TransientError``) to come again."""
        loop = asyncio.get_running_loop()
        until, delay = loop.time() + RECORD_PATIENCE_SECONDS, 0.02
        while not await self.store.has_stored(case_id, parked_attempt, PARKING_EVENT_TYPE):
            if loop.time() >= until:
                raise TransientError(f"case {case_id}: attempt {parked_attempt}, which waited "
                                     "for a person, is not stored yet")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _count_reviews(self) -> None:
        """Keep the review gauges (waiting, overdue, oldest wait) current, every sweep;
        an overdue review is seen and alerted on, never decided by the clock."""
        seen: set[str] = set()
        while True:
            try:
                counts = await self.store.review_counts()
            except StoreUnavailable as exc:
                log.warning("cannot count the cases waiting for people: %s", exc)
            else:
                now = datetime.now(UTC)
                for agent in seen - {c[0] for c in counts}:
                    for gauge in (metrics.REVIEWS_WAITING, metrics.REVIEWS_OVERDUE,
                                  metrics.REVIEW_OLDEST_WAIT_SECONDS):
                        gauge.labels(agent).set(0)
                for agent, waiting, overdue, oldest in counts:
                    metrics.REVIEWS_WAITING.labels(agent).set(waiting)
                    metrics.REVIEWS_OVERDUE.labels(agent).set(overdue)
                    metrics.REVIEW_OLDEST_WAIT_SECONDS.labels(agent).set(
                        0 if oldest is None else (now - oldest).total_seconds())
                    seen.add(agent)
            await asyncio.sleep(self.sweep_seconds)

    def _review_due(self, agent: AgentProfile, tenant: str, since: datetime | None
                    ) -> datetime:
        """When a wait that began at ``since`` becomes overdue: the tenant's deadline,
        else the agent's, else the deployment's."""
        seconds = self.review_policy(tenant).deadline_seconds
        if seconds is None and agent.review is not None and agent.review.deadline is not None:
            seconds = agent.review.deadline.total_seconds()
        return (since or datetime.now(UTC)) + timedelta(
            seconds=seconds or self.review_deadline_seconds)

    async def _mark_ended(self, case_id: uuid.UUID) -> None:
        await self._note(lambda: self._ended(case_id))

    @staticmethod
    async def _note(write: Callable[[], Awaitable[Any]]) -> None:
        """Write a case's end (or its wait for a person) to Postgres, trying until it
        is written: the start command is acked only after."""
        while True:
            try:
                await write()
                return
            except StoreUnavailable as exc:
                log.warning("cannot note a case's end yet: %s", exc)
                await asyncio.sleep(1.0)

    async def _release(self, case_id: uuid.UUID) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.store.renew_leases([case_id], self.owner, 0)


async def run_worker(settings: Settings) -> None:
    """The ``casetrail worker`` component, until SIGINT or SIGTERM."""
    signer = worker_signer(settings)
    async with component(settings, "worker") as parts:
        connection = await parts.connection()
        pool = await parts.pool(10)
        # The key must have been registered by an operator: the worker's role cannot.
        registered = await KeyRegistry(pool).registered(signer.key_id, signer.public_key)
        if registered is None:
            raise PermanentError(
                f"signing key {signer.key_id} is not registered: an operator registers it "
                f"with `casetrail signer register {settings.signing_key_file}` (setup does it "
                "for CASETRAIL_SIGNING_KEY_FILE)")
        if registered.not_valid_after is not None:
            raise PermanentError(f"signing key {signer.key_id} is retired: generate a new one "
                                 "and register it")
        log.info("signing events with key %s", signer.key_id)
        topology = Topology(settings.namespace)
        runtime = BusWorkerRuntime(
            connection, topology, await Publisher.open(connection),
            settings.capability_user, CapabilityKeys(CapabilityKeyRegistry(pool).all),
            default_policy=RetryPolicy(attempts=settings.tool_attempts,
                                       timeout_seconds=settings.tool_timeout_seconds),
            # An MCP server's calls wait as long as the operator says its tools take (and
            # a little for the bus), as often as it says.
            policies={mcp_capability(s.name): RetryPolicy(attempts=s.attempts,
                                                          timeout_seconds=s.timeout_seconds + 2)
                      for s in settings.mcp_servers}
            | {a2a_capability(a.name): RetryPolicy(attempts=a.attempts,
                                                   timeout_seconds=a.timeout_seconds + 2)
               for a in settings.a2a_agents},
        )
        await runtime.start()
        parts.stack.push_async_callback(runtime.close)
        secrets = CaseSecrets(pool, Vault.from_text(settings.master_key_text()))
        await secrets.check_master_key()
        models = ModelFactory(settings)  # one shared client per model endpoint
        parts.stack.push_async_callback(models.aclose)
        worker = CaseWorker(connection, CaseStore(pool), topology, runtime, signer,
                            settings.broker_user("api"), secrets,
                            KeyRegistry(pool), Caps.from_settings(settings),
                            models=models,
                            concurrency=settings.worker_concurrency,
                            lease_seconds=settings.lease_seconds,
                            sweep_seconds=settings.sweep_seconds,
                            duties=worker_duties(settings),
                            publish_retry_seconds=settings.publish_retry_seconds,
                            review_policy=settings.review_policy,
                            review_deadline_seconds=settings.review_deadline_seconds,
                            catalog_seconds=settings.mcp_catalog_seconds,
                            unconfigured=misconfigured(AGENTS, settings, CAPABILITIES))
        worker.catalogs.warm([server.name for server in settings.mcp_servers])
        for name, problems in worker.unconfigured.items():
            log.error("%s", described(name, problems))
        metrics.LIVE_CASES.set_function(lambda: len(worker.live_cases))
        metrics.SLOTS_BUSY.set_function(lambda: worker.slots_busy)
        probe = QueueProbe(connection, {"case-start": topology.case_start_queue},
                           settings.queue_probe_seconds)
        await run_until_signal(probe.beside(worker.run))


def _recorded_review(action: ParkedAction) -> CaseReviewedPayload:
    """The review the API kept, as ``CASE_REVIEWED`` records it, with what it signed."""
    return CaseReviewedPayload.model_validate({
        "reviewer": action.reviewer, "verdict": action.verdict, "decision": action.decision,
        "reason": action.reason, "reviewedAt": action.acted_at,
        "action": None if action.signed is None else action.signed.as_json()})


def _given_answer(action: ParkedAction) -> GivenAnswer:
    """A person's answer to the model's question, as the API kept it."""
    given = action.decision or {}
    return GivenAnswer(str(given.get("callId")), str(given.get("answer")),
                       dict(action.reviewer or {}), action.acted_at,
                       None if action.signed is None else action.signed.as_json())
