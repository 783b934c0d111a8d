-- casetrail schema, version 2: a trail that proves itself.
--
-- Every event from schema version 2 on is stored exactly as the worker signed it
-- (`body`, the RFC 8785 canonical envelope), with its place in the attempt's hash
-- chain and its Ed25519 signature. The columns people query (`payload`,
-- `event_type`, ...) are derived from `body`; `casetrail verify` checks they still
-- agree with it. Version-1 rows keep NULL here and verify as unsigned.

ALTER TABLE event_log
    ADD COLUMN tenant_id text NOT NULL DEFAULT 'default',
    ADD COLUMN prev_hash text,
    ADD COLUMN hash      text,
    ADD COLUMN key_id    text,
    ADD COLUMN sig       text,
    ADD COLUMN body      bytea;

ALTER TABLE event_log ADD CONSTRAINT event_log_signed_from_version_2 CHECK (
    schema_version < 2 OR (prev_hash IS NOT NULL AND hash IS NOT NULL
                           AND key_id IS NOT NULL AND sig IS NOT NULL AND body IS NOT NULL));

ALTER TABLE cases ADD COLUMN tenant_id text NOT NULL DEFAULT 'default';

-- The public keys events are signed with. A key stays here after it is retired, so
-- old trails still verify; events it signed after `not_valid_after` do not.
CREATE TABLE signing_keys (
    key_id          text        PRIMARY KEY CHECK (key_id ~ '^[0-9a-f]{16}$'),
    public_key      bytea       NOT NULL UNIQUE CHECK (length(public_key) = 32),
    created_at      timestamptz NOT NULL DEFAULT now(),
    retired_at      timestamptz,
    not_valid_after timestamptz,
    CHECK ((retired_at IS NULL) = (not_valid_after IS NULL))
);
