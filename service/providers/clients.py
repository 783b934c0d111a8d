"""One HTTP client per (provider, endpoint, key) per worker process, shared by every case.

A case used to build its own SDK client, i.e. its own connection pool, and never close
it: 1,000 cases opened 1,000 connections and reached 8 % of the throughput a 300 ms
model allows. Here a client is made on first use, kept while the process lives and
closed on shutdown; every case on the same endpoint with the same key shares its pool.

The client is aiohttp, spoken to directly: casetrail builds each request body and
reads each answer itself (``openai_compat``, ``anthropic_messages``), so the official
SDKs were only a way to send bytes, and the layers they add (typed options, URL and
header models, an httpx-shaped adapter over aiohttp) cost the worker more CPU per
model turn than everything else a turn does. Measured with ``python -m bench.models``
(docs/benchmarks.md, "Real models"): the SDKs over httpx, the SDKs over aiohttp, and
aiohttp alone.

- Redirects are never followed (a key must not go where a redirect points): a 3xx is
  an answer the case fails on.
- No proxy or ``.netrc`` from the environment (``trust_env`` off): a key goes to the
  configured endpoint and nowhere else; no cookies are kept between cases. An egress
  proxy is named explicitly (``CASETRAIL_MODEL_PROXY``) and carries https endpoints'
  connections as CONNECT tunnels, so it never sees a key; loopback endpoints go
  direct. ``CASETRAIL_MODEL_CA_FILE`` replaces the system's authorities.
- Pool size and timeouts: ``CASETRAIL_MODEL_POOL_SIZE``,
  ``CASETRAIL_MODEL_CONNECT_TIMEOUT_SECONDS``, ``CASETRAIL_MODEL_TIMEOUT_SECONDS``.
- A case's deadline cancels its in-flight request: aiohttp closes a connection whose
  answer was not read to the end instead of handing it to the next case, so one
  case's deadline never poisons another's request (tested).
- Every failure of the exchange is translated here into the project's kinds
  (``_errors``): transient (unreachable, timed out, 429/5xx) or permanent.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from casetrail.contract.model_providers import PROVIDERS
from casetrail.contract.version import CASETRAIL_VERSION
from casetrail.errors import ModelUnavailable, scrub
from casetrail.providers._errors import status_error

log = logging.getLogger("casetrail.models")

Provider = str
"""A remote provider's name (``service/contract/model_providers.py``)."""


@dataclass(frozen=True)
class PoolSettings:
    size: int = 256
    connect_timeout: float = 10.0
    timeout: float = 120.0
    proxy: str | None = None
    """The egress proxy for https endpoints (a CONNECT tunnel each connection)."""
    ca_file: str | None = None
    """The authorities endpoints' certificates are checked against; none: the system's."""


def _headers(provider: Provider, api_key: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "Accept": "application/json",
            "User-Agent": f"casetrail/{CASETRAIL_VERSION}",
            **PROVIDERS[provider].request_headers(api_key)}


class RemoteChatModel:
    """What every remote provider's ``ChatModel`` holds: the model's name, the most
    tokens an answer may take, and the process's shared client for the endpoint
    (``ModelClients``)."""

    default_max_tokens: int | None = None

    def __init__(self, model: str, client: ProviderClient, *,
                 max_tokens: int | None = None) -> None:
        self._model = model
        self._max_tokens = self.default_max_tokens if max_tokens is None else max_tokens
        self._client = client

    @property
    def name(self) -> str:
        return self._model


class ProviderClient:
    """Requests to one endpoint with one key, over one connection pool."""

    def __init__(self, provider: Provider, base_url: str | None, api_key: str,
                 pool: PoolSettings | None = None) -> None:
        self.provider: Provider = provider
        self.base_url = (base_url or PROVIDERS[provider].default_base_url).rstrip("/")
        self._headers = _headers(provider, api_key)
        self._pool = pool or PoolSettings()
        # Only a TLS connection goes through the proxy, tunnelled: the proxy never
        # sees the key (a loopback endpoint is this machine's, and goes direct).
        self._proxy = self._pool.proxy if self.base_url.startswith("https://") else None
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def _open(self) -> aiohttp.ClientSession:
        """The session, made in the running event loop on first use."""
        if self._closed:
            raise ModelUnavailable(f"{self.provider} client closed (the worker is stopping)")
        if self._session is None:
            verify: ssl.SSLContext | bool = True if self._pool.ca_file is None \
                else ssl.create_default_context(cafile=self._pool.ca_file)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool.size, limit_per_host=0,
                                               ssl=verify),
                timeout=aiohttp.ClientTimeout(total=self._pool.timeout,
                                              sock_connect=self._pool.connect_timeout),
                headers=self._headers, cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False, raise_for_status=False)
        return self._session

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``body`` as JSON to ``base_url + path``; the answer's JSON. A failed
        exchange raises ``ModelUnavailable`` (transient) or ``ModelRejected``."""
        session = self._open()
        try:
            async with session.post(self.base_url + path, data=orjson.dumps(body),
                                    allow_redirects=False, proxy=self._proxy) as response:
                raw = await response.read()
                status, headers = response.status, response.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else scrub(str(exc))
            raise ModelUnavailable(f"{self.provider} unreachable: {reason or type(exc).__name__}"
                                   ) from None
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            data = None
        if status >= 300:
            fallback = raw[:200].decode("utf-8", "replace") or f"HTTP {status}"
            raise status_error(self.provider, status, headers, data, fallback)
        if not isinstance(data, dict):
            raise ModelUnavailable(f"{self.provider} answered something that is not a "
                                   "JSON object")
        return data

    def is_closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()


@dataclass
class ModelClients:
    """The shared clients of one process."""

    pool: PoolSettings = field(default_factory=PoolSettings)
    _clients: dict[tuple[str, str | None, str], ProviderClient] = field(default_factory=dict)

    def client(self, provider: Provider, base_url: str | None, api_key: str
               ) -> ProviderClient:
        """The client for this endpoint and key, made on first use."""
        # The key itself is never kept as a dictionary key, only its digest.
        slot = (provider, base_url, hashlib.sha256(api_key.encode()).hexdigest())
        made = self._clients.get(slot)
        if made is None:
            made = self._clients[slot] = ProviderClient(provider, base_url, api_key,
                                                        self.pool)
            log.info("%s client for %s made (pool of %d)", provider, made.base_url,
                     self.pool.size)
        return made

    def __len__(self) -> int:
        return len(self._clients)

    async def aclose(self) -> None:
        """Close every client and its connections (the worker's shutdown)."""
        clients, self._clients = list(self._clients.values()), {}
        for made in clients:
            await made.aclose()
