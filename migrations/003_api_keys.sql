-- casetrail schema, version 3: who may call the API, and tenants.
--
-- An API key is `ct_<key_id>_<secret>`; only the SHA-256 of the whole key is kept
-- (the key is 256 random bits, so a fast hash is enough: nothing to brute-force).

CREATE TABLE api_keys (
    key_id      text        PRIMARY KEY CHECK (key_id ~ '^[0-9a-f]{12}$'),
    key_hash    text        NOT NULL CHECK (key_hash ~ '^[0-9a-f]{64}$'),
    tenant_id   text        NOT NULL CHECK (tenant_id ~ '^[a-z0-9][a-z0-9-]{0,39}$'),
    scopes      text[]      NOT NULL,
    name        text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    revoked_at  timestamptz
);

-- Idempotency keys are per tenant: one caller's key never replays another's case.
ALTER TABLE cases DROP CONSTRAINT cases_idempotency_key_key;
CREATE UNIQUE INDEX cases_tenant_idempotency_key ON cases (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Who started and who asked to stop each case (an API key id, or an OIDC subject).
ALTER TABLE cases
    ADD COLUMN started_by   text,
    ADD COLUMN cancelled_by text;
