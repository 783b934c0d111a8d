"""Postgres adapter for the API and the workers: cases, claims, and the auditor's query.

The API's and the workers' SQL is here, search and the log's tables included
(``search``, ``ledger``). Elsewhere only: the event-log writer
(``casetrail.consumers.writer``), the sequencer's appends under its lock
(``components/sequencer.py``), and the operator's statements (``ops/``: setup, migrations,
subscribers; the demo's auditor query). asyncpg's exceptions are translated here: a lost
or refused connection becomes ``StoreUnavailable``.

Its parts: ``pool`` (pools and error translation), ``cases`` (the case repository),
``secrets``, ``keys``, ``people`` (API keys, persons' names) and ``tenants``.
"""

from casetrail.adapters.store.cases import (
    CaseStore,
    Claim,
    NewCase,
    ParkedAction,
    RecordedCase,
    StoredEvent,
    TrailHead,
    Wait,
    locked_cases_cte,
)
from casetrail.adapters.store.keys import (
    CapabilityKeyRegistry,
    KeyRegistry,
)
from casetrail.adapters.store.people import (
    ApiKeyStore,
    PersonIdentities,
    principal_names,
)
from casetrail.adapters.store.pool import (
    component_pool,
    create_pool,
    pool_patiently,
    translate_errors,
    utc_text,
)
from casetrail.adapters.store.secrets import (
    CaseSecrets,
    SecretState,
)
from casetrail.adapters.store.tenants import (
    TenantReaders,
    rate_wait,
    tenant_counts,
)

__all__ = [
    "ApiKeyStore",
    "CapabilityKeyRegistry",
    "CaseSecrets",
    "CaseStore",
    "Claim",
    "KeyRegistry",
    "NewCase",
    "ParkedAction",
    "PersonIdentities",
    "RecordedCase",
    "SecretState",
    "StoredEvent",
    "TenantReaders",
    "TrailHead",
    "Wait",
    "component_pool",
    "create_pool",
    "locked_cases_cte",
    "pool_patiently",
    "principal_names",
    "rate_wait",
    "tenant_counts",
    "translate_errors",
    "utc_text",
]
