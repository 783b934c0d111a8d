"""Opening a robust broker connection, the one place casetrail does.

``CASETRAIL_AMQP_URL`` (and each component's ``_AMQP_URL``) may list several URLs of one
RabbitMQ cluster, comma-separated. A component then connects to the first node that
answers; when its connection is lost, or a node does not answer an attempt, the next
attempt goes to the next node in the list, round and round. aio-pika's robust
connection then restores channels, queues, bindings and consumers on the new node, and
publishes whose confirm the lost connection never delivered fail and are published
again by the publisher (a duplicate is harmless: consumers store idempotently).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any, TypeAlias

import aio_pika
import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from pamqp.common import FieldTable
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed
from yarl import URL

from casetrail.config import amqp_nodes
from casetrail.errors import BusUnavailable

log = logging.getLogger("casetrail.bus")

STARTUP_PATIENCE_SECONDS = 60.0
"""How long a component waits for the broker to answer at start."""


BusConnection: TypeAlias = AbstractRobustConnection
"""A connection to the broker that reconnects by itself, for the code that holds one."""

IncomingMessage: TypeAlias = AbstractIncomingMessage
"""A message taken from a queue, for the code that reads one (the demo, the operator)."""


def _where(url: str) -> str:
    return url.rsplit("@", maxsplit=1)[-1]


class ClusterConnection(aio_pika.RobustConnection):
    """A robust connection to one node of a cluster at a time, moving to the next node
    when the connection is lost or an attempt fails."""

    _ATTEMPT = "_RobustConnection__connect_transport"
    """aio-pika's one connection attempt (its reconnect loop calls it each time); wrapped
    below to move on after a failure. tests/integration/test_cluster_client.py checks it exists."""

    def __init__(self, urls: Sequence[str], start: int = 0, **kwargs: Any) -> None:
        self._nodes = [URL(u) for u in urls]
        self._node = start % len(self._nodes)
        super().__init__(self._nodes[self._node], **kwargs)

    @property
    def url(self) -> URL:
        """The node this connection is (or will next be) connected to."""
        return self._nodes[self._node]

    @url.setter
    def url(self, value: URL) -> None:
        # Set by aio-pika at start (the first node) and on update_secret (a new password,
        # which every node of the cluster shares).
        if value.password != self._nodes[self._node].password:
            self._nodes = [n.with_password(value.password) for n in self._nodes]

    def _next_node(self, why: str) -> None:
        if len(self._nodes) > 1:
            before = self._node
            self._node = (self._node + 1) % len(self._nodes)
            log.warning("%s: %s; next attempt on %s", why, _where(str(self._nodes[before])),
                        _where(str(self.url)))

    async def _on_connection_close(self, closing: Any) -> None:
        if not (self._close_called or self.is_closed):
            self._next_node("connection lost")
        await super()._on_connection_close(closing)

    async def _RobustConnection__connect_transport(self) -> None:
        try:
            await getattr(super(), self._ATTEMPT)()
        except CONNECTION_EXCEPTIONS:
            self._next_node("node did not answer")
            raise


async def connect(url: str, name: str) -> AbstractRobustConnection:
    """A robust connection: it reconnects and restores channels, queues and consumers;
    with several URLs, to whichever node of the cluster answers."""
    urls = amqp_nodes(url)
    properties: FieldTable = {"connection_name": name}
    if len(urls) == 1:
        try:
            return await aio_pika.connect_robust(urls[0], client_properties=properties)
        except (OSError, aiormq.exceptions.AMQPError) as exc:
            raise BusUnavailable(f"cannot reach RabbitMQ at {_where(urls[0])}: {exc}") from exc
    failures = []
    for start in range(len(urls)):
        connection = ClusterConnection(urls, start, client_properties=properties)
        try:
            await connection.connect()
        except (OSError, aiormq.exceptions.AMQPError, *CONNECTION_EXCEPTIONS) as exc:
            failures.append(f"{_where(urls[start])}: {exc}")
            with contextlib.suppress(Exception):
                await connection.close()
            continue
        return connection
    raise BusUnavailable("cannot reach any RabbitMQ node: " + "; ".join(failures))


async def connect_patiently(url: str, name: str,
                            patience: float = STARTUP_PATIENCE_SECONDS
                            ) -> AbstractRobustConnection:
    """A robust connection, waiting up to ``patience`` seconds for the broker at start-up."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(BusUnavailable), wait=wait_fixed(1),
        stop=stop_after_delay(patience), reraise=True,
    ):
        with attempt:
            return await connect(url, name)
    raise AssertionError("unreachable")


async def broker_answers(url: str) -> None:
    """Returns once the broker at ``url`` answers (a refused login included: that is for
    the next step to report)."""
    try:
        connection = await aio_pika.connect(url, timeout=5)
    except aio_pika.exceptions.ProbableAuthenticationError:
        return
    await connection.close()
