-- casetrail schema, version 13: each capability's X25519 public key: a tool request carries the sensitive values
-- its call needs sealed to it (HPKE, RFC 9180), so no queue and no dead letter ever
-- holds them in clear. Registered by `casetrail setup` (an operator's step); the
-- worker reads them, nobody else writes them.
CREATE TABLE capability_keys (
    capability    text PRIMARY KEY CHECK (capability ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    public_key    bytea NOT NULL CHECK (length(public_key) = 32),
    registered_at timestamptz NOT NULL DEFAULT now()
);
