"""Subscribers on the bus, per tenant (``casetrail subscribers create|list|revoke``).

A subscriber gets a broker identity of its own and one durable queue, declared and
bound by the operator (here) to ``case.<tenant>.#`` on ``<ns>.events``: that tenant's
events and nothing else. The identity may read that queue and do nothing more:
configure and write ``^$`` (RabbitMQ 3.10's topic permissions check only binding keys,
so what confines it is having no right to declare or bind anything). The queue is
bounded (``x-max-length``, ``x-max-length-bytes``, ``x-overflow: drop-head``, no
dead-letter exchange): a subscriber that stops reading loses its oldest events, never
the broker's memory or disk, so it can neither slow nor fail anyone's cases. What it
reads is the events exactly as signed: it checks them like anyone (docs/bundle.md).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime

from casetrail.adapters.bus.connection import connect
from casetrail.adapters.bus.topology import Topology
from casetrail.adapters.store import create_pool
from casetrail.adapters.store.subscribers import SubscriberStore
from casetrail.config import Settings
from casetrail.contract.auth import TENANT_PATTERN
from casetrail.errors import PermanentError

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")


@dataclass(frozen=True)
class Subscriber:
    name: str
    tenant: str
    created_at: datetime
    revoked_at: datetime | None
    queue: str
    user: str


def user_of(settings: Settings, name: str) -> str:
    return f"{settings.namespace}-subscriber-{name}"


def queue_of(settings: Settings, name: str) -> str:
    return f"{settings.namespace}.subscriber.{name}"


def _checked(name: str, tenant: str | None = None) -> None:
    if not NAME.match(name):
        raise PermanentError(f"subscriber name {name!r} must match {NAME.pattern}")
    if tenant is not None and not TENANT_PATTERN.match(tenant):
        raise PermanentError(f"tenant {tenant!r} must match {TENANT_PATTERN.pattern}")


async def create(settings: Settings, name: str, tenant: str) -> str:
    """Make (or renew, with a new password) subscriber ``name`` of ``tenant``; its AMQP
    URL, shown once."""
    from casetrail.ops.setup import _with_user, apply_broker_definitions, password_hash

    _checked(name, tenant)
    pool = await create_pool(settings.database_url, max_size=1)
    try:
        kept = await SubscriberStore(pool).tenant_of(name)
        if kept is not None and kept != tenant:
            raise PermanentError(f"subscriber {name!r} reads tenant {kept!r}, not {tenant!r}: "
                                 "revoke it first")
        password = secrets.token_urlsafe(24)
        user, queue = user_of(settings, name), queue_of(settings, name)
        vhost = settings.amqp_vhost()
        apply_broker_definitions(settings, {
            "users": [{"name": user, "tags": "", "password_hash": password_hash(password),
                       "hashing_algorithm": "rabbit_password_hashing_sha256"}],
            "permissions": [{"user": user, "vhost": vhost, "configure": "^$", "write": "^$",
                             "read": f"^{re.escape(queue)}$"}],
            "topic_permissions": [{"user": user, "vhost": vhost,
                                   "exchange": Topology(settings.namespace).events_exchange,
                                   "write": "^$", "read": "^$"}]})
        connection = await connect(settings.amqp_url, "casetrail-setup")
        try:
            channel = await connection.channel()
            topology = Topology(settings.namespace)
            declared = await channel.declare_queue(queue, durable=True, arguments={
                "x-queue-type": "quorum", "x-overflow": "drop-head",
                "x-max-length": settings.subscriber_max_events,
                "x-max-length-bytes": settings.subscriber_max_bytes})
            await declared.bind(topology.events_exchange,
                                routing_key=Topology.events_of(tenant=tenant))
        finally:
            await connection.close()
        await SubscriberStore(pool).keep(name, tenant)
        return _with_user(settings.amqp_url, user, password)
    finally:
        await pool.close()


async def listed(settings: Settings) -> list[Subscriber]:
    pool = await create_pool(settings.database_url, max_size=1)
    try:
        kept = await SubscriberStore(pool).listed()
    finally:
        await pool.close()
    return [Subscriber(k.name, k.tenant, k.created_at, k.revoked_at, queue_of(settings, k.name),
                       user_of(settings, k.name)) for k in kept]


async def revoke(settings: Settings, name: str) -> bool:
    """Delete the subscriber's identity and queue; ``False`` when there was none."""
    from casetrail.ops.setup import delete_broker_users

    _checked(name)
    pool = await create_pool(settings.database_url, max_size=1)
    try:
        known = await SubscriberStore(pool).revoke(name)
    finally:
        await pool.close()
    if not known:
        return False
    delete_broker_users(settings, [user_of(settings, name)])
    connection = await connect(settings.amqp_url, "casetrail-setup")
    try:
        channel = await connection.channel()
        await channel.queue_delete(queue_of(settings, name), if_unused=False, if_empty=False)
    finally:
        await connection.close()
    return True
