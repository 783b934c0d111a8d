-- casetrail schema, version 15: business keys. An agent names the input fields that
-- identify a case to people (the loan officer: applicantId; the AML agent: customerId);
-- each case's values are kept here, in clear, or, for a sensitive field, as a keyed
-- digest (HMAC under a key derived from the master key), so GET /cases?key=VALUE finds
-- a case by the value without the value being stored. Erasing a case deletes its
-- digests. Rows are written with the case, in its transaction; a search reads one
-- short range of an index, newest first, like the other search shapes (migration 008).
CREATE TABLE case_keys (
    case_id    uuid        NOT NULL REFERENCES cases (case_id) ON DELETE CASCADE,
    tenant_id  text        NOT NULL,
    field      text        NOT NULL CHECK (length(field) BETWEEN 1 AND 100),
    value      text        NOT NULL CHECK (length(value) BETWEEN 1 AND 300),
    digest     boolean     NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (case_id, field)
);
CREATE INDEX case_keys_by_value ON case_keys (tenant_id, value, created_at DESC, case_id DESC);
CREATE INDEX case_keys_by_field ON case_keys
    (tenant_id, field, value, created_at DESC, case_id DESC);
