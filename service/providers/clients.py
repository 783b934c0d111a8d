"""One SDK client per (provider, endpoint, key) per worker process, shared by every case.

A case used to build its own ``AsyncOpenAI``/``AsyncAnthropic``, i.e. its own
connection pool, and never close it: 1,000 cases opened 1,000 connections and reached
8 % of the throughput a 300 ms model allows. Here a client is made on first use, kept
while the process lives and closed on shutdown; every case on the same endpoint with
the same key shares its pool.

The transport is aiohttp under the SDKs' own ``DefaultAioHttpClient`` (the extras
``openai[aiohttp]``, ``anthropic[aiohttp]``), chosen by measurement:
``python -m bench.models`` drives 1,000 cases against a local server that answers
after 300 ms with either transport (``CASETRAIL_MODEL_HTTP_TRANSPORT``) and prints both;
docs/benchmarks.md has the figures. Redirects are never followed (a key must not go
where a redirect points). Pool size and timeouts: ``CASETRAIL_MODEL_POOL_SIZE``,
``CASETRAIL_MODEL_CONNECT_TIMEOUT_SECONDS``, ``CASETRAIL_MODEL_TIMEOUT_SECONDS``.

A case's deadline cancels its in-flight request (the engine wraps the call in a
timeout): the cancelled request's connection is dropped by the pool, not handed to the
next case half-read, so one case's deadline never poisons another's request.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import anthropic
import httpx2
import openai

log = logging.getLogger("casetrail.models")

Transport = Literal["aiohttp", "httpx"]


@dataclass(frozen=True)
class PoolSettings:
    size: int = 256
    connect_timeout: float = 10.0
    timeout: float = 120.0
    transport: Transport = "aiohttp"


@dataclass
class ModelClients:
    """The shared clients of one process."""

    pool: PoolSettings = field(default_factory=PoolSettings)
    _clients: dict[tuple[str, str | None, str], Any] = field(default_factory=dict)

    def _http(self, provider: str) -> Any:
        limits = httpx2.Limits(max_connections=self.pool.size,
                               max_keepalive_connections=self.pool.size)
        timeout = httpx2.Timeout(self.pool.timeout, connect=self.pool.connect_timeout)
        sdk: Any = openai if provider == "openai" else anthropic
        kind = sdk.DefaultAioHttpClient if self.pool.transport == "aiohttp" \
            else sdk.DefaultAsyncHttpxClient
        return kind(limits=limits, timeout=timeout, follow_redirects=False)

    def client(self, provider: Literal["openai", "anthropic"], base_url: str | None,
               api_key: str) -> Any:
        """The client for this endpoint and key, made on first use."""
        # The key itself is never kept as a dictionary key, only its digest.
        slot = (provider, base_url, hashlib.sha256(api_key.encode()).hexdigest())
        made = self._clients.get(slot)
        if made is None:
            sdk: Any = openai.AsyncOpenAI if provider == "openai" else anthropic.AsyncAnthropic
            made = sdk(api_key=api_key, base_url=base_url, max_retries=0,
                       timeout=self.pool.timeout, http_client=self._http(provider))
            self._clients[slot] = made
            log.info("%s client for %s made (pool of %d, %s)", provider,
                     base_url or "the provider's API", self.pool.size, self.pool.transport)
        return made

    def __len__(self) -> int:
        return len(self._clients)

    async def aclose(self) -> None:
        """Close every client and its connections (the worker's shutdown)."""
        clients, self._clients = list(self._clients.values()), {}
        for made in clients:
            await made.close()
