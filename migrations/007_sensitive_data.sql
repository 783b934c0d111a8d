-- casetrail schema, version 7: sensitive input values, kept apart and erasable.
--
-- A case's sensitive input values (fields its agent's input model marks) are never
-- in `cases.input` or the log: placeholders stand there, and the values sit here,
-- AES-256-GCM encrypted under a per-case data key that is itself wrapped by the
-- master key (service/sensitive.py). Erasing a case deletes the wrapped key and the
-- ciphertext (crypto-shredding) and records who and when, here and as a
-- CASE_ERASED event after the terminal one.
CREATE TABLE case_secrets (
    case_id        uuid        PRIMARY KEY REFERENCES cases (case_id) ON DELETE CASCADE,
    master_key_id  text        NOT NULL,
    wrapped_key    bytea,
    ciphertext     bytea,
    placeholders   text[]      NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    erased_at      timestamptz,
    erased_by      text,
    CONSTRAINT case_secrets_erased_means_gone CHECK (
        (erased_at IS NULL) = (wrapped_key IS NOT NULL AND ciphertext IS NOT NULL))
);

-- Who read a case's sensitive values in clear, exported its bundle or erased it.
CREATE TABLE access_log (
    access_id   uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    at          timestamptz NOT NULL DEFAULT now(),
    principal   text        NOT NULL,
    tenant_id   text        NOT NULL,
    case_id     uuid        NOT NULL,
    action      text        NOT NULL CHECK (action IN ('pii:read', 'export', 'erase'))
);
CREATE INDEX access_log_case ON access_log (case_id, at);

CREATE FUNCTION append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP;
END;
$$;
CREATE TRIGGER access_log_no_update_or_delete
    BEFORE UPDATE OR DELETE ON access_log
    FOR EACH ROW EXECUTE FUNCTION append_only();
CREATE TRIGGER access_log_no_truncate
    BEFORE TRUNCATE ON access_log
    FOR EACH STATEMENT EXECUTE FUNCTION append_only();
ALTER TABLE access_log ENABLE ALWAYS TRIGGER access_log_no_update_or_delete;
ALTER TABLE access_log ENABLE ALWAYS TRIGGER access_log_no_truncate;

-- The erasure's own event, after the terminal one.
ALTER TABLE event_log DROP CONSTRAINT event_log_event_type_check;
ALTER TABLE event_log ADD CONSTRAINT event_log_event_type_check CHECK (event_type IN (
    'CASE_STARTED', 'REACT_CYCLE', 'CASE_COMPLETED', 'CASE_FAILED',
    'CASE_TIMED_OUT', 'CASE_CANCELLED', 'CASE_ERASED'));
