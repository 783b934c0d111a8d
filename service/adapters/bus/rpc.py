"""WorkerTools over RabbitMQ: the caller's ``WorkerRuntime`` and the wire format of
tool requests and replies.

A request goes to ``<ns>.capabilities`` with the capability name as routing
key, into the durable quorum queue ``<ns>.capability.<name>`` (declared by
``casetrail setup`` or the capability's worker, so a request waits for a worker; a
capability nobody declared is an error of the call, not a wait). The reply comes
back on the caller's exclusive reply queue through ``<ns>.replies``, correlated by an
unpredictable token of the call, and is taken only from the broker user of the
capability called (the broker vouches for ``user_id``; each capability has its own,
which alone reads that capability's requests); a reply from anyone else is
dead-lettered. Each attempt has
a timeout (also set as the message's expiration, so a request nobody took in time
is dropped by the broker); each capability has a retry policy with jittered
exponential backoff. Every attempt of one call carries the same idempotency key, so
a capability worker can recognise a retry; a late reply to an earlier attempt still
answers the call.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Literal

import orjson
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from tenacity import wait_exponential_jitter

from casetrail.adapters.bus.dead_letter import dead_letter
from casetrail.adapters.bus.deliveries import Delivery, Subscription
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.contract.commands import ToolReply, ToolRequest
from casetrail.contract.dead_letters import DeadLetterCode
from casetrail.contract.events import ToolAttempt
from casetrail.engine.backoff import backoff_delay
from casetrail.engine.tools import WorkerCallResult
from casetrail.errors import CasetrailError, PublishRejected
from casetrail.privacy.sealing import CapabilityKeys, seal
from casetrail.privacy.sensitive import Redaction

log = logging.getLogger("casetrail.rpc")

IDEMPOTENCY_HEADER = "x-idempotency-key"


@dataclass(frozen=True)
class RetryPolicy:
    """How a capability is retried: attempts, per-attempt timeout, backoff between them."""

    attempts: int = 3
    timeout_seconds: float = 10.0
    backoff_initial: float = 0.2
    backoff_max: float = 2.0


@dataclass
class _PendingCall:
    call_id: str
    capability: str
    future: asyncio.Future[ToolReply]
    sent_at: dict[int, float] = field(default_factory=dict)


@dataclass
class BusWorkerRuntime:
    """``WorkerRuntime`` that runs capabilities on capability workers over RabbitMQ."""

    connection: AbstractRobustConnection
    topology: Topology
    publisher: Publisher
    capability_user: Callable[[str], str]
    """The broker user whose replies a capability's calls take (``Settings.capability_user``)."""
    sealing_keys: CapabilityKeys | None = None
    """The capabilities' public keys, for calls that hold sensitive values."""
    default_policy: RetryPolicy = field(default_factory=RetryPolicy)
    policies: Mapping[str, RetryPolicy] = field(default_factory=dict)
    _pending: dict[str, _PendingCall] = field(default_factory=dict)
    _refused: set[asyncio.Task[None]] = field(default_factory=set)
    _reply_queue: str | None = None
    _channel: AbstractChannel | None = None
    _replies: Subscription | None = None

    async def start(self) -> None:
        channel = await self.connection.channel()
        # A named exclusive queue: a robust connection re-declares it with the same
        # name after a reconnect, so replies keep finding the caller.
        name = f"{self.topology.namespace}.reply.{uuid.uuid4().hex}"
        queue = await channel.declare_queue(name, exclusive=True, auto_delete=True)
        # Replies come through <ns>.replies, keyed by this queue's name (bound with the
        # robust channel, so the binding comes back with it after a reconnect).
        await queue.bind(await channel.get_exchange(self.topology.replies_exchange,
                                                    ensure=False), routing_key=name)
        self._replies = Subscription(channel, name, self._on_reply, no_ack=True)
        await self._replies.start()
        self._reply_queue, self._channel = name, channel

    async def close(self) -> None:
        for pending in self._pending.values():
            pending.future.cancel()
        if self._replies is not None:
            await self._replies.cancel()
        if self._channel is not None:
            await self._channel.close()

    def _on_reply(self, message: Delivery) -> None:
        pending = self._pending.get(message.correlation_id or "")
        if pending is None or pending.future.done():
            log.info("late or unknown tool reply (from %r) ignored", message.user_id)
            return
        expected = self.capability_user(pending.capability)
        if message.user_id != expected:
            self._refuse(message, f"tool reply from broker user {message.user_id!r}, not the "
                                  f"user of capability {pending.capability!r} ({expected!r})",
                         DeadLetterCode.FOREIGN_SENDER)
            return
        try:
            reply = ToolReply.model_validate(orjson.loads(message.body))
        except (ValueError, orjson.JSONDecodeError) as exc:
            log.warning("unreadable tool reply dropped: %s", exc)
            return
        if reply.idempotency_key != pending.call_id:
            self._refuse(message, "tool reply for another call than its correlation id's",
                         DeadLetterCode.WRONG_CALL)
            return
        pending.future.set_result(reply)

    def _refuse(self, message: Delivery, reason: str, code: DeadLetterCode) -> None:
        task = asyncio.create_task(dead_letter(self.publisher, self.topology, message, reason,
                                               code))
        self._refused.add(task)
        task.add_done_callback(self._refused.discard)

    async def execute(
        self, capability: str, args: Mapping[str, Any], *, call_id: str, retry: bool = True,
        redaction: Redaction | None = None,
    ) -> WorkerCallResult:
        """Call ``capability``, retried by its policy unless ``retry`` is false (one
        attempt: a tool that may not run twice). With the case's ``redaction``, every
        sensitive value in ``args`` travels as its placeholder, and the values sealed to
        the capability's key; a capability with no registered key is not sent them at
        all."""
        if self._reply_queue is None or self._channel is None:
            raise CasetrailError("BusWorkerRuntime.start() was not called")
        sealed = None
        if redaction is not None:
            args, values = redaction.hide(args)
            if values:
                key = None if self.sealing_keys is None else \
                    await self.sealing_keys.get(capability)
                if key is None:
                    return WorkerCallResult(error=(
                        f"{capability} has no sealing key registered (`casetrail setup`): "
                        "its call holds sensitive values, which are never sent in clear"))
                sealed = seal(key, values, capability, call_id)
        policy = self.policies.get(capability, self.default_policy)
        if not retry:
            policy = replace(policy, attempts=1)
        loop = asyncio.get_running_loop()
        pending = _PendingCall(call_id, capability, loop.create_future())
        # The reply must quote this token: nobody can answer a call they cannot see.
        token = secrets.token_hex(16)
        self._pending[token] = pending
        backoff = wait_exponential_jitter(
            multiplier=policy.backoff_initial, max=policy.backoff_max
        )
        attempts: list[ToolAttempt] = []
        try:
            for attempt in range(1, policy.attempts + 1):
                started = time.perf_counter()
                pending.sent_at[attempt] = started
                request = ToolRequest(
                    idempotency_key=call_id, capability=capability, args=dict(args),
                    sealed=sealed, attempt=attempt,
                    deadline=time.time() + policy.timeout_seconds,
                )
                try:
                    await self.publisher.publish(
                        self.topology.capabilities_exchange,
                        capability,
                        orjson.dumps(request.model_dump(mode="json", by_alias=True)),
                        message_id=f"{call_id}#{attempt}",
                        correlation_id=token,
                        reply_to=self._reply_queue,
                        headers={IDEMPOTENCY_HEADER: call_id},
                        expiration_seconds=policy.timeout_seconds,
                    )
                except PublishRejected:
                    attempts.append(self._attempt(
                        attempt, "error", started,
                        f"no queue serves {capability!r} (not set up, or no such capability)"))
                    return WorkerCallResult(error=attempts[-1].error, attempts=tuple(attempts))
                try:
                    reply = await asyncio.wait_for(
                        asyncio.shield(pending.future), policy.timeout_seconds
                    )
                except TimeoutError:
                    attempts.append(self._attempt(attempt, "timeout", started,
                                                  f"no reply within {policy.timeout_seconds:g}s"))
                else:
                    # A late reply to an earlier attempt answers the call too; time it
                    # from when that attempt was sent.
                    answered = pending.sent_at.get(reply.attempt, started)
                    outcome: Literal["ok", "error"] = "ok" if reply.ok else "error"
                    attempts.append(self._attempt(reply.attempt, outcome, answered, reply.error,
                                                  reply.worker))
                    if reply.ok:
                        return WorkerCallResult(result=reply.result, attempts=tuple(attempts))
                    if not reply.retryable:
                        return WorkerCallResult(error=reply.error, attempts=tuple(attempts))
                    pending.future = loop.create_future()
                if attempt < policy.attempts:
                    await asyncio.sleep(backoff_delay(backoff, attempt))
        finally:
            self._pending.pop(token, None)
        last = attempts[-1]
        return WorkerCallResult(
            error=(
                f"{capability} failed after {len(attempts)} attempts; last: "
                f"{last.outcome}{': ' + last.error if last.error else ''}"
            ),
            attempts=tuple(attempts),
        )

    @staticmethod
    def _attempt(
        number: int,
        outcome: Literal["ok", "error", "timeout"],
        started: float,
        error: str | None = None,
        worker: str | None = None,
    ) -> ToolAttempt:
        return ToolAttempt(
            attempt=number, outcome=outcome,
            duration=timedelta(seconds=time.perf_counter() - started),
            error=error, worker=worker,
        )
