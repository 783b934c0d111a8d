"""``setup``, ``up`` and ``demo`` wait for RabbitMQ and PostgreSQL to accept before they
do anything (docs/operations.md, "Starting"): bounded (``CASETRAIL_SERVICES_WAIT_SECONDS``),
with a line saying what they wait for, retrying refusals; on giving up, one line naming
the service and what to do (``ServicesUnavailable``), never a traceback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from tenacity import AsyncRetrying, RetryError, stop_after_delay, wait_exponential

from casetrail.adapters.bus.connection import broker_answers
from casetrail.adapters.store.pool import server_answers
from casetrail.config import Settings, amqp_nodes
from casetrail.errors import PermanentError

log = logging.getLogger("casetrail.setup")


class ServicesUnavailable(PermanentError):
    """A service a stack needs did not accept connections in time."""


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or ''}".rstrip(":")


async def _accepting(name: str, url: str, probe: Callable[[str], Awaitable[None]],
                     seconds: float,
                     remedy: str) -> None:
    told = False
    try:
        async for attempt in AsyncRetrying(stop=stop_after_delay(seconds),
                                           wait=wait_exponential(multiplier=0.2, max=2)):
            with attempt:
                try:
                    await probe(url)
                except Exception:
                    if not told:
                        log.warning("waiting for %s at %s to accept connections (up to "
                                    "%g s) ...", name, _where(url), seconds)
                        told = True
                    raise
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        raise ServicesUnavailable(
            f"{name} at {_where(url)} did not accept connections within {seconds:g} s "
            f"({type(cause).__name__}: {cause}): {remedy}") from None
    if told:
        log.warning("%s at %s accepts connections", name, _where(url))


async def wait_for_services(settings: Settings) -> None:
    """Both services accepting, or ``ServicesUnavailable`` naming the one that is not."""
    seconds = settings.services_wait_seconds
    await asyncio.gather(
        _accepting("PostgreSQL", settings.database_url, server_answers, seconds,
                   "start it (`make services`, or `pg_ctlcluster ... start`), or point "
                   "CASETRAIL_DATABASE_URL at it"),
        _accepting("RabbitMQ", amqp_nodes(settings.amqp_url)[0], broker_answers, seconds,
                   "start it (`make services`, or `rabbitmq-server -detached`), or point "
                   "CASETRAIL_AMQP_URL at it"))
