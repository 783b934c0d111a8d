-- casetrail schema, version 16: subscribers on the bus, per tenant. `casetrail
-- subscribers create NAME --tenant T` makes a broker identity that may read one queue,
-- bound to that tenant's events only; this records which exist, for `list`, `revoke`
-- and `setup --remove`.
CREATE TABLE subscribers (
    name       text        PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,39}$'),
    tenant_id  text        NOT NULL CHECK (tenant_id ~ '^[a-z0-9][a-z0-9-]{0,39}$'),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
