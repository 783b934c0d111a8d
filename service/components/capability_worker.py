"""The capability worker: serves WorkerTool requests for one or more capabilities.

It validates each request's arguments against the capability's model (bad
arguments get an error reply, not a crash), runs the handler, replies to the
caller, and only then acks. Results are remembered by idempotency key for a
while, so a retry of a call already answered gets the same answer without
running the handler again. On shutdown it stops taking requests, finishes
those it holds, and lets the broker hand back anything unacked.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from pydantic import ValidationError

from casetrail.adapters.bus.connection import BusConnection
from casetrail.adapters.bus.deliveries import Delivery, Subscription, TaskPerDelivery
from casetrail.adapters.bus.publisher import Publisher
from casetrail.adapters.bus.topology import Topology
from casetrail.components.runtime import component
from casetrail.components.supervisor import run_until_signal
from casetrail.config import Settings
from casetrail.contract.commands import ToolReply, ToolRequest
from casetrail.contract.dead_letters import DeadLetterCode
from casetrail.contract.events import describe_validation_error
from casetrail.engine.tools import Capability, ToolFailed
from casetrail.errors import PermanentError, Reject
from casetrail.privacy import sealing
from casetrail.privacy.sealing import open_sealed
from casetrail.privacy.sensitive import restore
from casetrail.telemetry import metrics, tracing

log = logging.getLogger("casetrail.capability")

REMEMBERED_REPLIES = 10_000


def _digest(args: Any) -> str:
    return hashlib.sha256(orjson.dumps(args, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass
class CapabilityWorker:
    """Serves ``capabilities`` from their queues, ``concurrency`` requests at once."""

    connection: BusConnection
    topology: Topology
    capabilities: Sequence[Capability[Any]]
    concurrency: int = 64
    sealing_keys: Mapping[str, X25519PrivateKey] = field(default_factory=dict)
    """The private keys of the capabilities served, which open a request's sealed values."""
    name: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    served: int = 0
    _answers: OrderedDict[tuple[str, str, str], ToolReply] = field(default_factory=OrderedDict)

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=self.concurrency)
        publisher = await Publisher.open(self.connection, retry_seconds=10.0)
        subscriptions, serving = [], []
        for capability in self.capabilities:
            queue = await self.topology.capability_queue_declared(channel, capability.name)

            async def serve(message: Delivery, target: Capability[Any] = capability) -> None:
                await self._serve(message, target, publisher)

            tasks = TaskPerDelivery(serve, publisher, self.topology)
            subscription = Subscription(channel, queue.name, tasks)
            await subscription.start()
            subscriptions.append(subscription)
            serving.append(tasks)
        log.info("serving %s as %s", ", ".join(c.name for c in self.capabilities), self.name)
        if ready is not None:
            ready.set()
        await stop.wait()
        for subscription in subscriptions:
            await subscription.cancel()
        await asyncio.gather(*(tasks.drain(30) for tasks in serving))
        for capability in self.capabilities:
            if capability.close is not None:
                await capability.close()
        await publisher.channel.close()
        await channel.close()

    async def _serve(
        self, message: Delivery, capability: Capability[Any], publisher: Publisher
    ) -> None:
        """Answer one request. Returning acks it; ``Reject`` dead-letters it."""
        if not tracing.ENABLED:
            await self._answer(message, capability, publisher)
            return
        queue = self.topology.capability_queue(capability.name)
        with tracing.continued(message.headers):
            span = tracing.start(f"process {queue}", tracing.SpanKind.CONSUMER, {
                "messaging.system": "rabbitmq", "messaging.operation.type": "process",
                "messaging.destination.name": queue, tracing.TOOL_NAME: capability.name,
                "casetrail.capability.worker": self.name})
            with tracing.current(span):
                try:
                    outcome = await self._answer(message, capability, publisher)
                except Reject as exc:
                    tracing.failed(span, exc.code, exc.reason)
                    raise
                else:
                    if outcome == "error":
                        tracing.failed(span, "tool_error")
                finally:
                    span.end()

    async def _answer(
        self, message: Delivery, capability: Capability[Any], publisher: Publisher
    ) -> str:
        """Answer one request; says how (ok, error, remembered, expired)."""
        try:
            request = ToolRequest.model_validate(orjson.loads(message.body))
        except (ValidationError, orjson.JSONDecodeError) as exc:
            raise Reject(f"unreadable tool request: {exc}", DeadLetterCode.UNREADABLE) from exc
        if time.time() > request.deadline:
            log.info("request %s expired before it was served", message.message_id)
            metrics.TOOL_REQUESTS_SERVED.labels(capability.name, "expired").inc()
            return "expired"
        args, refused = self._opened(request, capability)
        if refused is None and message.redelivered and capability.at_most_once is not None \
                and capability.at_most_once(request.args):
            refused = ("this call may have run already (its request came back from a worker "
                       "that stopped holding it), and its tool may run at most once")
        # Remembered by capability, arguments and key: a retry gets the answer it
        # asked for, and a request that reuses someone's key with other arguments
        # (or for another capability) is run on its own, not handed their answer.
        remembered = (capability.name, _digest(args), request.idempotency_key)
        reply = self._answers.get(remembered)
        if refused is not None:
            reply = ToolReply(idempotency_key=request.idempotency_key, attempt=request.attempt,
                              worker=self.name, ok=False, retryable=False, error=refused)
            outcome = "error"
        elif reply is None or (not reply.ok and reply.retryable):
            reply = await self._run(request, args, capability)
            if capability.remembered is None or capability.remembered(request.args):
                self._answers[remembered] = reply
                if len(self._answers) > REMEMBERED_REPLIES:
                    self._answers.popitem(last=False)
            outcome = "ok" if reply.ok else "error"
        else:
            reply = reply.model_copy(update={"attempt": request.attempt})
            outcome = "remembered"
        metrics.TOOL_REQUESTS_SERVED.labels(capability.name, outcome).inc()
        if message.reply_to:
            try:
                await publisher.publish(
                    self.topology.replies_exchange, message.reply_to,
                    orjson.dumps(reply.model_dump(mode="json", by_alias=True)),
                    correlation_id=message.correlation_id, persistent=False,
                )
            except PermanentError as exc:
                log.info("caller of %s is gone (%s)", request.idempotency_key, exc)
        self.served += 1
        return outcome

    def _opened(self, request: ToolRequest, capability: Capability[Any]
                ) -> tuple[dict[str, Any], str | None]:
        """The request's arguments with its sealed values back in their places, or why
        they cannot be."""
        if request.sealed is None:
            return request.args, None
        key = self.sealing_keys.get(capability.name)
        if key is None:
            return request.args, (f"this worker holds no sealing key for {capability.name} "
                                  "(CASETRAIL_CAPABILITY_SEALING_KEYS, or the secrets file)")
        try:
            values = open_sealed(key, request.sealed, capability.name, request.idempotency_key)
        except PermanentError as exc:
            return request.args, str(exc)
        if capability.admits is not None and (refusal := capability.admits(request.args,
                                                                           values)):
            return request.args, refusal
        return restore(request.args, values), None

    async def _run(self, request: ToolRequest, args: dict[str, Any],
                   capability: Capability[Any]) -> ToolReply:
        base = {"idempotency_key": request.idempotency_key, "attempt": request.attempt,
                "worker": self.name}
        try:
            result = await capability.invoke(args)
            reply = ToolReply(**base, ok=True, result=orjson.loads(orjson.dumps(result)))
        except ValidationError as exc:
            reason = describe_validation_error(exc, "(arguments)")
            reply = ToolReply(**base, ok=False, retryable=False,
                              error=f"invalid arguments: {reason}")
        except ToolFailed as exc:
            reply = ToolReply(**base, ok=False, retryable=exc.retryable, error=str(exc))
        except Exception as exc:
            reply = ToolReply(**base, ok=False, retryable=True,
                              error=f"{type(exc).__name__}: {exc}")
        return reply


async def run_capability_worker(
    settings: Settings, capabilities: Sequence[Capability[Any]], concurrency: int | None
) -> None:
    """The ``casetrail capability-worker`` component, until SIGINT or SIGTERM: each
    capability served on a connection of its own, as that capability's own broker user
    (which may read that capability's requests and no other's). It keeps to the public
    aiormq path: its rate is the tools' own, not the bus's."""
    identities = [settings.capability_identity(c.name) for c in capabilities]  # all, first
    topology = Topology(settings.namespace)
    async with component(settings, "capability") as parts:
        workers: list[CapabilityWorker] = []
        for capability, identity in zip(capabilities, identities, strict=True):
            connection = await parts.connection(identity.amqp_url,
                                                f"casetrail-capability-{capability.name}")
            key = settings.capability_sealing_key(capability.name)
            workers.append(CapabilityWorker(
                connection, topology, [capability],
                concurrency=concurrency or settings.capability_concurrency,
                sealing_keys={} if key is None else {
                    capability.name: sealing.private_key(key, capability.name)}))

        async def serve_all(stop: asyncio.Event) -> None:
            await asyncio.gather(*(worker.run(stop) for worker in workers))

        await run_until_signal(serve_all)
