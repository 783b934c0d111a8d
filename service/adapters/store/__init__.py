"""Postgres adapter for the API and the workers: cases, claims, and the auditor's query.

Only this module and the event-log writer speak SQL. asyncpg's exceptions are
translated here: a lost or refused connection becomes ``StoreUnavailable``.

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
