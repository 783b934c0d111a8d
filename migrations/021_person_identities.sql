-- casetrail schema, version 21: one person across keys and tokens (docs/design.md,
-- "People"). A person acts through identities: an OIDC subject (`oidc:<sub>`) or the
-- person id of keys made with `--person` (`key:<person>`). An operator links the
-- identities that are the same person (`casetrail persons link`), and four eyes
-- compares persons: whoever started a case never reviews it, by any identity linked to
-- theirs. An identity nobody linked is its own person (its sub, or its person id).
-- No component writes here.
CREATE TABLE person_identities (
    identity  text        PRIMARY KEY CHECK (identity ~ '^(oidc|key):[^[:cntrl:]]{1,200}$'),
    person    text        NOT NULL CHECK (person ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,199}$'),
    linked_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX person_identities_person ON person_identities (person);
